"""The config tree: presets and ``extends``, TOML files, ``--set`` overrides, and validation that
names the key, the allowed values, the nearest spelling, or the reason a combination is impossible."""

from __future__ import annotations

import tomllib
import warnings
from pathlib import Path

import pytest

from attnlab.base.errors import UserError
from attnlab.config import (
    Config,
    ConfigError,
    apply_overrides,
    deep_merge,
    dump_toml,
    load_config,
    parse_override,
    preset_names,
    source_dict,
    validate,
)

SMALL = ["model.d_model=32", "model.attention.n_heads=4", "model.max_seq_len=64", "data.seq_len=32"]


def refused(*overrides: str, preset: str | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(preset, [*SMALL, *overrides])
    return str(info.value)


# ------------------------------------------------------------------------------------ defaults


@pytest.mark.fast
def test_defaults_are_valid_and_config_errors_are_user_errors() -> None:
    cfg = load_config()
    assert isinstance(cfg, Config)
    assert cfg.model.query.kind == "linear" and cfg.model.family == "decoder"
    assert issubclass(ConfigError, UserError)


def test_derived_properties() -> None:
    m = load_config(None, ["model.attention.n_kv_heads=2", *SMALL]).model
    assert (m.head_dim, m.n_kv_heads, m.ffn_hidden) == (8, 2, 128)
    m = load_config(None, ["model.attention.head_dim=16", *SMALL]).model
    assert m.head_dim == 16 and m.n_kv_heads == 4


# ------------------------------------------------------------------------------ unknown / wrong


@pytest.mark.parametrize(
    "override,unknown,near",
    [
        ("model.qurey.kind=linear", "model.qurey", "model.query"),
        ("model.query.kidn=linear", "model.query.kidn", "model.query.kind"),
        ("modle.d_model=3", "modle", "model"),
        ("model.pre_proj.enabled=true", "model.pre_proj", "model.pre_projection"),
        ("train.learning_rate=1e-3", "train.learning_rate", None),
    ],
)
def test_unknown_key_names_the_nearest_valid_spelling(
    override: str, unknown: str, near: str | None
) -> None:
    msg = refused(override)
    assert f"unknown key '{unknown}'" in msg
    if near:
        assert f"did you mean '{near}'?" in msg
    assert "Valid keys here:" in msg


def test_unknown_key_in_a_toml_file(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text('[model.query]\nkind = "nonlinear"\nratoi = 0.5\n')
    with pytest.raises(ConfigError, match=r"did you mean 'model\.query\.ratio'"):
        load_config(p)


def test_wrong_literal_names_the_allowed_values() -> None:
    msg = refused("model.query.kind=nonlin")
    assert "'model.query.kind'" in msg and "'nonlin'" in msg
    for allowed in ("linear", "identity", "nonlinear", "anchored"):
        assert allowed in msg
    msg = refused("model.position.kind=rotary")
    assert all(k in msg for k in ("none", "learned", "sinusoidal", "rope", "alibi", "t5"))


@pytest.mark.parametrize(
    "override,words",
    [
        ("model.d_model=abc", ["model.d_model", "integer"]),
        ("model.d_model=32.5", ["model.d_model", "integer"]),
        ("model.d_model=0", ["model.d_model", "greater than or equal to 1"]),
        ("model.dropout=1.5", ["model.dropout", "less than 1"]),
        (
            "model.query.ratio=-1",
            ["model.query.ratio", "'ratio' is an option of query kind 'nonlinear' or 'anchored'"],
        ),
        ("eval.tasks=3", ["eval.tasks", "list"]),
    ],
)
def test_wrong_type_or_range_names_the_key(override: str, words: list[str]) -> None:
    msg = refused(override)
    for w in words:
        assert w in msg


# ------------------------------------------------------------------------ impossible combinations

IMPOSSIBLE = {
    "heads_not_dividing_d": (["model.attention.n_heads=5"], "not divisible"),
    "kv_heads_not_dividing": (["model.attention.n_kv_heads=3"], "must divide"),
    "kv_heads_above_heads": (["model.attention.n_kv_heads=8"], "must divide"),
    "identity_query_width": (
        ["model.query.kind=identity", "model.attention.head_dim=16"],
        "model.query.kind='identity' needs d_model == n_heads * head_dim",
    ),
    "nonlinear_query_width": (
        ["model.query.kind=nonlinear", "model.attention.head_dim=4"],
        "model.query.kind='nonlinear'",
    ),
    "scale_form_not_nonlinear": (
        ["model.query.scale_form=true"],
        "'scale_form' is an option of query kind 'nonlinear'",
    ),
    "scale_form_qk_norm": (
        [
            "model.query.kind=nonlinear",
            "model.query.scale_form=true",
            "model.attention.qk_norm=true",
        ],
        "qk_norm",
    ),
    "virtual_heads_flash": (
        ["model.score.kind=virtual_heads", "model.attention.backend=flash"],
        "fused kernel never",
    ),
    "alibi_flash": (
        ["model.position.kind=alibi", "model.attention.backend=flash"],
        "adds a bias to the logits",
    ),
    "t5_flash": (["model.position.kind=t5", "model.attention.backend=flash"], "flash"),
    "sliding_flash": (
        [
            "model.mask.kind=sliding",
            "model.mask.window=4",
            "model.attention.backend=flash",
        ],
        "needs an explicit mask",
    ),
    "sliding_without_window": (["model.mask.kind=sliding"], "window >= 1"),
    "local_global_without_globals": (
        ["model.mask.kind=local_global", "model.mask.window=4"],
        "global_every or model.mask.n_global",
    ),
    "prefix_without_length": (["model.mask.kind=prefix"], "prefix_len >= 1"),
    "encoder_causal": (["model.family=encoder"], "hide the right context"),
    "encoder_prefix": (
        ["model.family=encoder", "model.mask.kind=prefix", "model.mask.prefix_len=2"],
        "hide the right context",
    ),
    "decoder_bidirectional": (["model.mask.kind=full"], "causal LM"),
    "encoder_decoder_prefix": (
        [
            "model.family=encoder_decoder",
            "model.n_decoder_layers=2",
            "model.mask.kind=prefix",
            "model.mask.prefix_len=2",
        ],
        "prefix LMs",
    ),
    "rope_odd_dims": (
        ["model.position.kind=rope", "model.position.rope_fraction=0.375"],
        "even number >= 2",
    ),
    "encoder_decoder_without_decoder_depth": (
        ["model.family=encoder_decoder"],
        "needs model.n_decoder_layers",
    ),
    "moe_top_k": (
        [
            "model.value.kind=moe",
            "model.value.n_experts=2",
            "model.value.top_k=3",
        ],
        "exceeds",
    ),
    "moe_encoder": (
        [
            "model.value.kind=moe",
            "model.family=encoder",
            "model.mask.kind=full",
        ],
        "decoder' only",
    ),
    "virtual_2d_causal": (
        ["model.score.kind=virtual_heads", "model.score.conv=2d"],
        "conv='2d'",
    ),
    "virtual_heads_not_multiple_of_kv": (
        [
            "model.score.kind=virtual_heads",
            "model.score.n_virtual=3",
            "model.attention.n_kv_heads=2",
        ],
        "must be a multiple",
    ),
    "nonlinear_mixer_with_mlp": (["model.mixer.kind=nonlinear"], "model.mixer.kind='nonlinear'"),
    "parallel_post_ln": (
        ["model.residual_kind=parallel", "model.norm_position=post"],
        "pre-norm blocks only",
    ),
    "parallel_without_mlp": (
        ["model.residual_kind=parallel", "model.mlp=false"],
        "needs model.mlp",
    ),
    "parallel_without_residual": (
        ["model.residual_kind=parallel", "model.residual=false"],
        "needs model.residual=true",
    ),
    "parallel_encoder_decoder": (
        [
            "model.residual_kind=parallel",
            "model.family=encoder_decoder",
            "model.n_decoder_layers=2",
        ],
        "cross-attention",
    ),
    "learned_positions_too_short": (["data.seq_len=128"], "exceeds model.max_seq_len"),
    "min_lr_above_lr": (["train.lr=1e-4", "train.min_lr=1e-3"], "train.min_lr"),
    "warmup_beyond_steps": (["train.max_steps=10", "train.warmup_steps=20"], "warmup_steps"),
}


@pytest.mark.parametrize("name", sorted(IMPOSSIBLE))
def test_impossible_combination_is_refused_with_its_reason(name: str) -> None:
    overrides, reason = IMPOSSIBLE[name]
    msg = refused(*overrides)
    assert reason in msg, msg


@pytest.mark.fast
def test_several_problems_are_reported_together() -> None:
    msg = refused(
        "model.mask.kind=sliding",
        "model.query.kind=nonlinear",
        "model.query.scale_form=true",
        "model.attention.qk_norm=true",
    )
    assert msg.count("impossible combination") == 2


def test_a_part_option_is_validated_by_the_parts_own_options_class() -> None:
    msg = refused("model.query.kind=nonlinear", "model.query.ratio=-1")
    assert "'model.query.ratio' = -1" in msg and "greater than 0" in msg
    msg = refused("model.query.kind=nonlinear", "model.query.activation=tanh")
    assert "'model.query.activation' = 'tanh' is not allowed" in msg


def test_switching_a_slots_kind_drops_the_old_parts_options_it_lacks_with_a_note(tmp_path) -> None:
    from attnlab.config import DroppedOptionWarning

    path = tmp_path / "nlq.toml"
    path.write_text('extends = "tiny"\n[model.query]\nkind = "nonlinear"\nratio = 0.25\n')
    with pytest.warns(DroppedOptionWarning, match=r"has no option 'ratio' \(set for kind"):
        cfg = load_config(path, ["model.query.kind=identity"]).model
    assert cfg.query.kind == "identity" and "ratio" not in cfg.query.model_dump()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the preset's ratio = 0.5 is the default: no choice lost
        cfg = load_config("gpt2-124m-nonlinear-query", ["model.query.kind=identity"]).model
    assert cfg.query.kind == "identity"
    cfg = load_config(
        "gpt2-124m-nonlinear-query", ["model.query.ratio=0.25", "model.query.kind=anchored"]
    ).model
    assert cfg.query.kind == "anchored" and cfg.query.ratio == 0.25


def test_keys_of_earlier_versions_name_what_replaced_them() -> None:
    msg = refused("model.content_skip.enabled=true")
    assert "it is now [model.side_branch] kind = 'content_skip'" in msg
    msg = refused("model.query.fused=false")
    assert "it is now model.attention.fuse_qkv" in msg


def test_2d_virtual_heads_refused_outside_an_encoder() -> None:
    """The decoder of an encoder-decoder is causal: a 2-D conv there would read later tokens."""
    refused(
        "model.family=encoder_decoder",
        "model.n_decoder_layers=2",
        "model.mask.kind=full",
        "model.score.kind=virtual_heads",
        "model.score.conv=2d",
    )


def test_2d_virtual_heads_allowed_in_an_encoder() -> None:
    cfg = load_config(
        None,
        [
            *SMALL,
            "model.family=encoder",
            "model.mask.kind=full",
            "model.score.kind=virtual_heads",
            "model.score.conv=2d",
        ],
    )
    assert cfg.model.score.conv == "2d"


# ------------------------------------------------------------------------------------- --set


@pytest.mark.parametrize(
    "item,key,value",
    [
        ("model.d_model=64", ["model", "d_model"], 64),
        ("train.lr=3e-4", ["train", "lr"], 3e-4),
        ("train.lr=0.5", ["train", "lr"], 0.5),
        ("model.bias=true", ["model", "bias"], True),
        ("model.bias=false", ["model", "bias"], False),
        ("model.query.kind=nonlinear", ["model", "query", "kind"], "nonlinear"),
        ('experiment.name="3"', ["experiment", "name"], "3"),
        ("train.device=cuda:0", ["train", "device"], "cuda:0"),
        ('eval.tasks=["perplexity", "lambada"]', ["eval", "tasks"], ["perplexity", "lambada"]),
        ("experiment.tags=[]", ["experiment", "tags"], []),
        (" model.d_model = 64 ", ["model", "d_model"], 64),
        ("data.corpus=a=b", ["data", "corpus"], "a=b"),
    ],
)
def test_parse_override_reads_toml_values_else_strings(item: str, key: list[str], value) -> None:
    got_key, got = parse_override(item)
    assert got_key == key and got == value and type(got) is type(value)


@pytest.mark.parametrize("item", ["model.d_model", "=3", "model..d_model=3", "model.=3"])
def test_bad_override_syntax(item: str) -> None:
    with pytest.raises(ConfigError):
        parse_override(item)


def test_overrides_apply_in_order_and_build_nested_tables() -> None:
    raw = apply_overrides(
        {"model": {"d_model": 32}},
        ["model.query.kind=nonlinear", "model.d_model=48", "model.d_model=64"],
    )
    assert raw == {"model": {"d_model": 64, "query": {"kind": "nonlinear"}}}
    cfg = load_config("tiny", ['eval.tasks=["perplexity", "lambada"]', "model.query.kind=identity"])
    assert cfg.eval.tasks == ["perplexity", "lambada"] and cfg.model.query.kind == "identity"
    assert cfg.model.d_model == 64  # the rest of the preset is kept


def test_deep_merge_merges_tables_and_replaces_values() -> None:
    base = {"a": {"b": 1, "c": {"d": 2}}, "e": [1]}
    out = deep_merge(base, {"a": {"c": {"f": 3}}, "e": [2]})
    assert out == {"a": {"b": 1, "c": {"d": 2, "f": 3}}, "e": [2]}
    assert base == {"a": {"b": 1, "c": {"d": 2}}, "e": [1]}  # untouched


# ----------------------------------------------------------------------------- presets and files


def test_preset_extends_its_parent() -> None:
    base, nl = load_config("gpt2-124m"), load_config("gpt2-124m-nonlinear-query")
    assert nl.model.query.kind == "nonlinear" and nl.model.query.ratio == 0.5
    assert nl.train.lr == 3e-3 and nl.train.weight_decay == 0.03125  # its own recipe
    assert nl.model.d_model == base.model.d_model == 768  # inherited
    assert nl.train.tokens_per_step == base.train.tokens_per_step
    p410 = load_config("pythia-410m-preproj-skip")  # two levels: -> pythia-410m -> pythia-160m
    assert (p410.model.d_model, p410.model.n_layers, p410.model.attention.n_heads) == (1024, 24, 16)
    assert p410.model.residual_kind == "parallel" and p410.model.position.fraction == 0.25
    assert p410.model.feature_map.kind == "pre_projection"
    assert p410.model.side_branch.kind == "content_skip"
    assert "extends" not in source_dict("pythia-410m-preproj-skip")


def test_unknown_preset_names_close_matches() -> None:
    with pytest.raises(ConfigError, match=r"unknown preset 'gpt2-124' ?; did you mean 'gpt2-124m'"):
        load_config("gpt2-124")


def test_toml_file_with_extends_and_overrides(tmp_path: Path) -> None:
    p = tmp_path / "exp.toml"
    p.write_text(
        'extends = "tiny"\n\n[model]\nn_layers = 3\n\n[model.query]\nkind = "nonlinear"\n'
        "\n[train]\nlr = 1e-3\n"
    )
    cfg = load_config(p, ["train.max_steps=70"])
    assert cfg.model.n_layers == 3 and cfg.model.query.kind == "nonlinear"
    assert cfg.model.d_model == 64 and cfg.data.tokenizer == "bytes"  # from tiny
    assert cfg.train.lr == 1e-3 and cfg.train.max_steps == 70
    plain = tmp_path / "plain.toml"
    plain.write_text("[model]\nd_model = 48\nn_layers = 1\n\n[model.attention]\nn_heads = 4\n")
    assert load_config(str(plain)).model.d_model == 48


def test_file_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "latin1.toml"
    bad.write_bytes('[experiment]\nname = "caf\xe9"\n'.encode("latin-1"))
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(bad)
    broken = tmp_path / "broken.toml"
    broken.write_text("[model\nd_model = 3\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(broken)
    ext = tmp_path / "ext.toml"
    ext.write_text("extends = 3\n")
    with pytest.raises(ConfigError, match="'extends' must be a preset name"):
        load_config(ext)
    ext.write_text('extends = "tinyy"\n')
    with pytest.raises(ConfigError, match="did you mean 'tiny'"):
        load_config(ext)


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_loads_and_dump_toml_round_trips(name: str) -> None:
    cfg = load_config(name)
    text = dump_toml(cfg)
    again = validate(tomllib.loads(text))
    assert again == cfg
    assert dump_toml(again) == text


def test_dump_toml_round_trips_odd_strings_and_lists() -> None:
    cfg = load_config(
        "tiny",
        [
            'experiment.name="q\\"uote \\\\ caf\u00e9\\t"',
            'experiment.tags=["a b", ""]',
            "model.attention.n_kv_heads=2",
            "train.lr=1e-05",
            "train.min_lr=0",
        ],
    )
    assert validate(tomllib.loads(dump_toml(cfg))) == cfg


def test_dump_toml_escapes_control_characters() -> None:
    cfg = load_config("tiny", ['experiment.name="two\\nlines"'])
    assert validate(tomllib.loads(dump_toml(cfg))).experiment.name == "two\nlines"


def test_the_model_config_has_one_table_per_slot_in_block_order():
    """The config's slot tables are the slots' declared ``config_field`` (parts/slots.py)."""
    from attnlab.config import SLOT_FIELDS, ModelConfig
    from attnlab.parts.slots import SLOTS

    assert [f"model.{f}" for f in SLOT_FIELDS] == [s.config_field for s in SLOTS.values()]
    assert set(SLOT_FIELDS) <= set(ModelConfig.model_fields)
