"""Probe method strings and the probe config: parsing, validation, overrides, experiments."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnlab.config import ConfigError
from attnlab.probe.config import load_experiment, load_probe_config
from attnlab.probe.methods import MethodError, method_slug, parse_method
from tests.helpers.paths import PACKAGE


@pytest.mark.parametrize(
    ("text", "components", "name"),
    [
        ("frozen", set(), "frozen"),
        ("baseline", set(), "frozen"),
        ("lora", {"lora"}, "lora"),
        ("skip+preproj", {"preproj", "skip"}, "preproj+skip"),
        ("pre-projection + content-skip", {"preproj", "skip"}, "preproj+skip"),
        ("anchored+preproj", {"preproj", "anchored-query"}, "preproj+anchored-query"),
        ("preproj+lora", {"preproj", "lora"}, "preproj+lora"),
    ],
)
def test_parse_method_components_and_canonical_name(text, components, name):
    m = parse_method(text)
    assert set(m.components) == components
    assert m.name == name
    assert m.frozen == (not components)


def test_lora_match_target():
    m = parse_method("lora@skip+preproj")
    assert m.components == {"lora"}
    assert m.lora_match is not None and m.lora_match.name == "preproj+skip"
    assert m.name == "lora@preproj+skip"
    assert method_slug(m) == "lora-at-preproj-skip"
    assert [c.name for c in parse_method("preproj+lora@preproj+skip").injects] == ["preproj"]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "empty method"),
        ("prepoj", "did you mean 'preproj'"),
        ("preproj++skip", "stray '+'"),
        ("preproj+preproj", "twice"),
        ("frozen+skip", "cannot be combined"),
        ("preproj@skip", "needs 'lora'"),
        ("lora@frozen", "0 parameters"),
        ("lora@lora@preproj", "more than one '@'"),
        ("lora@preproj+lora@skip", "more than one '@'"),
    ],
)
def test_bad_methods_say_why(text, fragment):
    with pytest.raises(MethodError, match=fragment.replace("+", r"\+")):
        parse_method(text)


@pytest.mark.fast
def test_config_defaults_follow_the_paper_recipe():
    cfg = load_probe_config(None)
    t = cfg.train
    assert (t.lr, t.batch_size, t.seq_len, t.max_steps, t.beta2) == (1e-5, 16, 512, 500, 0.999)
    assert t.dtype == "auto" and t.tokens_per_step is None
    assert (t.plan.micro, t.plan.accum, t.plan.sequences) == (16, 1, 16)  # effective batch 16


def test_config_overrides_and_method_canonicalisation(tmp_path: Path):
    f = tmp_path / "p.toml"
    f.write_text('method = "skip+preproj"\n[train]\nmax_steps = 3\ntokens_per_step = 8192\n')
    cfg = load_probe_config(f, ["train.batch_size=4", "lora.rank=8"])
    assert cfg.method == "preproj+skip"
    assert cfg.train.max_steps == 3 and cfg.lora.rank == 8
    # 8192 tokens = 16 sequences of 512 per step, in 4 micro-batches of 4
    assert (cfg.train.plan.micro, cfg.train.plan.accum, cfg.train.plan.sequences) == (4, 4, 16)


def test_unknown_key_names_the_nearest_spelling(tmp_path: Path):
    with pytest.raises(ConfigError, match=r"unknown key 'train.lr_max'.*did you mean 'train.lr'"):
        load_probe_config(None, ["train.lr_max=1e-3"])
    with pytest.raises(ConfigError, match=r"unknown key 'probe.feature_map.expanson'"):
        load_probe_config(None, ["probe.feature_map.expanson=2"])
    with pytest.raises(ConfigError, match=r"it is now \[probe.feature_map\] kind = 'pre_proj"):
        load_probe_config(None, ["pre_projection.expansion=2"])


def test_bad_values_fail_at_load_time():
    with pytest.raises(ConfigError, match="did you mean 'preproj'"):
        load_probe_config(None, ["method=prepoj"])
    with pytest.raises(ConfigError, match="not a multiple"):
        load_probe_config(None, ["train.batch_size=5", "train.tokens_per_step=8192"])
    with pytest.raises(ConfigError, match=r"'base\.dtype'"):
        load_probe_config(None, ["base.dtype=int8"])


def test_experiment_file_methods_and_fairness(tmp_path: Path):
    f = tmp_path / "e.toml"
    f.write_text(
        'name = "x"\n'
        'methods = ["frozen", "lora@preproj+skip", {method = "preproj+lora", name = "pl", '
        "lora = {rank = 4}, train = {batch_size = 2}}]\n"
        "[train]\nmax_steps = 7\nbatch_size = 4\nseq_len = 64\ntokens_per_step = 256\n"
    )
    name, cfgs = load_experiment(f, ["train.lr=1e-3"])
    assert name == "x"
    assert [c.label for c in cfgs] == ["frozen", "lora@preproj+skip", "pl"]
    assert all(c.train.max_steps == 7 and c.train.lr == 1e-3 for c in cfgs)
    assert cfgs[2].lora.rank == 4 and cfgs[0].lora.rank == 64
    # a method's own micro-batch: the same 4 sequences per step, in 2 micro-batches of 2
    assert [(c.train.plan.micro, c.train.plan.accum) for c in cfgs] == [(4, 1), (4, 1), (2, 2)]
    with pytest.raises(ConfigError, match="experiment file"):
        load_probe_config(f)

    unfair = tmp_path / "u.toml"
    unfair.write_text('methods = [{method = "preproj", train = {max_steps = 9}}]\n')
    with pytest.raises(ConfigError, match=r"train\.max_steps.*same base, data, batches"):
        load_experiment(unfair)
    unfair.write_text('methods = ["frozen", {method = "preproj", train = {batch_size = 8}}]\n')
    with pytest.raises(ConfigError, match=r"reads 8 sequences per step and methods\[0\] 16"):
        load_experiment(unfair)
    dup = tmp_path / "d.toml"
    dup.write_text('methods = ["preproj", "pre-projection"]\n')
    with pytest.raises(ConfigError, match="appears twice"):
        load_experiment(dup)


# ------------------------------------------------------------- [train] keys before the shared recipe


def test_old_probe_keys_are_refused_in_one_line_naming_the_new_keys(tmp_path: Path):
    with pytest.raises(ConfigError) as e:
        load_probe_config(None, ["train.steps=50"])
    assert str(e.value) == (
        "train.steps was renamed train.max_steps (the same number of optimizer steps); write "
        "max_steps = 50 in [train] or --set train.max_steps=50"
    )
    old = tmp_path / "old.toml"
    old.write_text("[train]\nsteps = 10\nbatch_size = 16\nmicro_batch_size = 4\nseq_len = 128\n")
    with pytest.raises(ConfigError) as e:
        load_probe_config(old)
    text = str(e.value)
    assert "\n" not in text and text.startswith("train.steps was renamed train.max_steps")
    assert (
        "train.micro_batch_size was removed: train.batch_size is now the micro-batch (as in "
        "attnlab train) and train.tokens_per_step the whole batch in tokens; for batch_size = 16, "
        "micro_batch_size = 4, seq_len = 128 write batch_size = 4, tokens_per_step = 2048"
    ) in text
    exp = tmp_path / "exp.toml"
    exp.write_text('methods = ["frozen", {method = "preproj", train = {steps = 3}}]\n')
    with pytest.raises(ConfigError, match=r"methods\[1\].*train\.steps was renamed"):
        load_experiment(exp)


@pytest.mark.parametrize(
    ("old", "micro", "accum", "sequences"),
    [
        ({"steps": 10, "batch_size": 16, "micro_batch_size": 4, "seq_len": 128}, 4, 4, 16),
        ({"steps": 10, "batch_size": 8, "micro_batch_size": 8, "seq_len": 64}, 8, 1, 8),
        ({"steps": 10, "batch_size": 6}, 6, 1, 6),
        ({"micro_batch_size": 2}, 2, 8, 16),  # the old default batch of 16 x 512
    ],
)
def test_recorded_old_probe_configs_train_the_same_batches(old, micro, accum, sequences):
    """A config recorded by an earlier attnlab (probe.json, probe.toml, a checkpoint) is read in
    today's keys: the same steps, micro-batch and sequences per step as it trained with."""
    from attnlab.probe.config import validate_probe
    from attnlab.probe.moved_keys import upgrade_recorded

    raw = {"method": "preproj", "train": old}
    with pytest.raises(ConfigError, match=r"was re(named|moved)"):
        validate_probe(raw)
    t = validate_probe(upgrade_recorded(raw)).train
    assert t.max_steps == old.get("steps", 500)
    assert (t.plan.micro, t.plan.accum, t.plan.sequences) == (micro, accum, sequences)
    assert upgrade_recorded({"train": {"max_steps": 3}}) == {"train": {"max_steps": 3}}


def test_an_old_probe_directory_resumes_in_todays_keys(tmp_path: Path):
    """A probe directory whose checkpoint and probe.toml hold the old keys is the same training
    as today's config of that recipe: no conflict, no rewrite warning; a real change still is."""
    import warnings

    import torch

    from attnlab.base.errors import UserError
    from attnlab.probe.config import dump_probe_toml
    from attnlab.probe.moved_keys import upgrade_recorded
    from attnlab.runs import checkpoint, rundir
    from attnlab.runs.records import ConfigRecord

    keys = ["train.max_steps=10", "train.batch_size=4", "train.seq_len=128"]
    new = dump_probe_toml(load_probe_config(None, [*keys, "train.tokens_per_step=2048"]))
    old = new.replace("max_steps = 10", "steps = 10").replace("tokens_per_step = 2048\n", "")
    old = old.replace("batch_size = 4\n", "batch_size = 16\nmicro_batch_size = 4\n")
    assert "steps = 10" in old and "micro_batch_size = 4" in old and "tokens_per_step" not in old
    record = ConfigRecord(file="probe.toml", text=old)
    empty_optim = {"state": {}, "param_groups": []}
    checkpoint.write_checkpoint(tmp_path, 2, {"w": torch.zeros(1)}, empty_optim, {}, config=record)
    (tmp_path / "probe.toml").write_text(old)
    assert "train.max_steps: None -> 10" in rundir.config_conflicts(
        tmp_path, new, file="probe.toml"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rundir.reconcile_config(tmp_path, new, file="probe.toml", upgrade=upgrade_recorded)
    other = new.replace("tokens_per_step = 2048", "tokens_per_step = 4096")
    with pytest.raises(UserError, match=r"train\.tokens_per_step: 2048 -> 4096"):
        rundir.reconcile_config(tmp_path, other, file="probe.toml", upgrade=upgrade_recorded)


# ------------------------------------------------------------- part tables: [probe.<slot>]


def test_the_probe_tables_are_the_slots_a_probe_injects_into() -> None:
    from attnlab.parts.slots import probe_slots
    from attnlab.probe.part_tables import ProbeParts

    assert set(ProbeParts.model_fields) == {s.name for s in probe_slots()}


def test_a_slot_table_configures_the_methods_part_in_the_models_words(tmp_path: Path):
    f = tmp_path / "p.toml"
    f.write_text(
        'method = "preproj+skip"\n[probe.feature_map]\nkind = "pre_projection"\n'
        "expansion = 2.0\n[probe.side_branch]\ninit_std = 0.5\n"
    )
    cfg = load_probe_config(f)
    opts = {c.kind: cfg.part_options(c) for c in cfg.parsed_method.injects}
    assert opts["pre_projection"].expansion == 2.0
    # no kind: the method's part in that slot
    assert opts["content_skip"].kind == "content_skip" and opts["content_skip"].init_std == 0.5
    assert load_probe_config(None).part_options(cfg.parsed_method.injects[0]).expansion != 2.0


def test_old_parts_tables_load_as_todays_with_a_note_naming_the_new_spelling(tmp_path: Path):
    from attnlab.probe.config import OldKeyWarning, dump_probe_toml

    with pytest.warns(OldKeyWarning) as said:
        old = load_probe_config(None, ["parts.preproj.expansion=3", "parts.skip.init_std=0.5"])
    notes = sorted(str(w.message) for w in said)
    assert notes[0].startswith(
        "[parts.preproj] is the old spelling of [probe.feature_map] kind = 'pre_projection'"
    )
    assert (
        "[parts.skip] is the old spelling of [probe.side_branch] kind = 'content_skip'"
        in (notes[1])
    )
    new = load_probe_config(
        None, ["probe.feature_map.expansion=3", "probe.side_branch.init_std=0.5"]
    )
    assert dump_probe_toml(old) == dump_probe_toml(new)
    assert "[probe.feature_map]" in dump_probe_toml(new) and "[parts" not in dump_probe_toml(new)


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            ["probe.feature_map.kind=none"],
            r"probe\.feature_map\.kind='none' but method 'preproj\+skip' injects 'pre_projection'",
        ),
        (
            ["method=lora", "probe.feature_map.expansion=2"],
            r"probe\.feature_map names no kind and method 'lora' injects no feature_map part",
        ),
        (
            ["parts.preproj.expansion=2", "probe.feature_map.expansion=3"],
            r"parts\.preproj and probe\.feature_map both set the options of the feature_map part",
        ),
        (["parts.nope.expansion=2"], r"parts\.nope: no injectable part is called 'nope'"),
        (["parts=3"], r"\[parts\.NAME\] is the old spelling of \[probe\.<slot>\]"),
    ],
)
def test_a_part_table_that_contradicts_the_method_is_refused(sets, message):
    with pytest.raises(ConfigError, match=message):
        load_probe_config(None, sets)


def test_a_table_of_a_slot_the_method_leaves_empty_is_kept_unused():
    cfg = load_probe_config(None, ["method=lora", "probe.feature_map.kind=pre_projection"])
    assert cfg.probe.feature_map is not None and cfg.parsed_method.injects == []


def test_an_experiments_shared_table_reaches_only_the_methods_injecting_its_part(tmp_path: Path):
    """A shared table configures the methods whose part in that slot is of its kind; a method's
    own table merges over it (or replaces it with another kind); old tables merge the same way."""
    import warnings

    f = tmp_path / "e.toml"
    f.write_text(
        "[probe.feature_map]\nexpansion = 2.0\n"
        '[[methods]]\nmethod = "preproj"\n'
        '[[methods]]\nmethod = "preproj"\nname = "wide"\n'
        "probe = { feature_map = { expansion = 3.0 } }\n"
        '[[methods]]\nmethod = "lora"\n'
        '[[methods]]\nmethod = "skip"\nname = "old"\nparts = { skip = { init_std = 0.5 } }\n'
    )
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        _, (shared, wide, lora, old) = load_experiment(f)
    assert shared.probe.feature_map.expansion == 2.0 and wide.probe.feature_map.expansion == 3.0
    assert lora.probe.feature_map is None  # a kind-less table of a slot lora leaves empty
    assert old.probe.feature_map is None and old.probe.side_branch.init_std == 0.5
    assert [str(w.message)[:14] for w in said] == ["[parts.skip] i"]


def test_an_old_probe_directorys_part_tables_compare_equal_to_todays(tmp_path: Path):
    """A probe.toml recorded with [parts.NAME] tables is the same training as today's config
    with [probe.<slot>] tables: resuming it finds no difference, and says nothing."""
    import warnings

    from attnlab.config import to_toml
    from attnlab.probe.config import dump_probe_toml, validate_probe
    from attnlab.probe.moved_keys import upgrade_recorded
    from attnlab.runs import rundir

    cfg = load_probe_config(None, ["probe.feature_map.expansion=3"])
    raw = cfg.to_dict()
    raw["parts"] = {"pre_projection": raw.pop("probe")["feature_map"]}
    old = to_toml(raw)
    assert "[parts.pre_projection]" in old
    (tmp_path / "probe.toml").write_text(old)
    new = dump_probe_toml(cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert rundir.config_conflicts(tmp_path, new, file="probe.toml") != []
        assert (
            rundir.config_conflicts(tmp_path, new, file="probe.toml", upgrade=upgrade_recorded)
            == []
        )
        assert validate_probe(upgrade_recorded(raw)) == cfg


def test_old_keys_live_in_one_table() -> None:
    """The probe's and the training config's old keys are one module's (config.legacy): no
    second ``RENAMED`` table anywhere."""
    import re

    src = PACKAGE
    tables = [
        str(p.relative_to(src))
        for p in src.rglob("*.py")
        if re.search(r"^\w*RENAMED\w* = \{", p.read_text(encoding="utf-8"), re.M)
    ]
    assert tables == ["config/legacy.py"]
