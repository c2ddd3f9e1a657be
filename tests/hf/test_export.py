"""``attnlab export``: every decoder variant loads in transformers (without attnlab, through the
folder's own code) with attnlab's logits and greedy tokens; plugin parts travel with the folder;
weights, tokenizer, generation config and card are standard files."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from attnlab.base.errors import UserError
from attnlab.bench.variants import VARIANTS
from attnlab.cli import main
from attnlab.config import load_config
from attnlab.hf.configuration import AttnlabConfig
from attnlab.hf.export import export, load_source
from attnlab.hf.verify import check_exports
from tests.helpers.hf import alternation_run, fake_run, python_without_attnlab
from tests.helpers.paths import EXAMPLES

torch.set_num_threads(1)
_BASE = load_config("tiny")

#: every bench variant, plus the standard components a variant list does not reach
CASES: dict[str, list[str]] = {
    name: [f"model.{o}" for o in v.resolved_overrides(_BASE)] for name, v in VARIANTS.items()
}
CASES |= {
    "gqa_rope_quarter_parallel": [
        "model.attention.n_kv_heads=2",
        "model.position.kind=rope",
        "model.position.rope_fraction=0.25",
        "model.residual_kind=parallel",
    ],
    "alibi_sliding_window": [
        "model.position.kind=alibi",
        "model.mask.kind=sliding",
        "model.mask.window=6",
    ],
    "t5_rmsnorm_swiglu_qk_norm": [
        "model.position.kind=t5",
        "model.norm.kind=rmsnorm",
        "model.ffn.kind=swiglu",
        "model.attention.qk_norm=true",
    ],
    "untied_biases_mqa": [
        "model.tie_embeddings=false",
        "model.bias=true",
        "model.attention.n_kv_heads=1",
    ],
    "local_global_sinusoidal": [
        "model.mask.kind=local_global",
        "model.mask.window=4",
        "model.mask.global_every=5",
        "model.position.kind=sinusoidal",
    ],
    "bigbird_rope": [
        "model.mask.kind=bigbird",
        "model.mask.window=4",
        "model.mask.n_global=1",
        "model.mask.block_size=4",
        "model.mask.random_blocks=1",
        "model.mask.random_seed=5",
        "model.position.kind=rope",
    ],
    "prefix_lm_post_ln": [
        "model.mask.kind=prefix",
        "model.mask.prefix_len=4",
        "model.norm_position=post",
    ],
}
PLUGIN = "plugin_parts"
PLUGIN_OVERRIDES = ["model.query.kind=gated_hf", "model.side_branch.kind=low_rank_skip_hf"]


def _plugin_file(folder: Path) -> Path:
    """The README's example plugin under kind names of its own (this process may hold the
    example's own names from other test files)."""
    text = (EXAMPLES / "my_ideas.py").read_text()
    text = text.replace('"gated")', '"gated_hf")').replace(
        '"low_rank_skip")', '"low_rank_skip_hf")'
    )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "hf_ideas.py").write_text(text)
    return folder / "hf_ideas.py"


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, Path]:
    """name -> exported folder (runs beside it), for every case and the plugin run."""
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for i, (name, overrides) in enumerate(CASES.items()):
        run = fake_run(root / "runs" / name, overrides, seed=i)
        out[name] = export(run, root / "hf" / name).out
    plugin = _plugin_file(root / "lab")
    run = fake_run(root / "runs" / PLUGIN, PLUGIN_OVERRIDES, plugins=[str(plugin)])
    out[PLUGIN] = export(run, root / "hf" / PLUGIN).out
    return out


@pytest.fixture(scope="module")
def checks(exported) -> dict[str, object]:
    """One child interpreter without attnlab loads every folder (trust_remote_code=True)."""
    jobs = []
    for folder in exported.values():
        model, _, tok, _, _ = load_source(folder.parent.parent / "runs" / folder.name)
        jobs.append((folder, model, tok))
    results = check_exports(jobs)
    return {name: c for name, c in zip(exported, results)}


@pytest.mark.parametrize("name", [*CASES, PLUGIN])
def test_remote_code_without_attnlab_equals_attnlab(checks, name):
    check = checks[name]
    assert check.remote_module.startswith("transformers_modules.")  # the folder's own code
    assert check.remote_module.endswith(".modeling_attnlab")
    assert check.max_abs_logits < 1e-4, check.max_abs_logits
    assert check.max_abs_step_logits < 1e-4, check.max_abs_step_logits
    assert check.greedy_equal, (check.attnlab_tokens, check.transformers_tokens)
    assert check.pipeline_equal
    assert check.tokens_equal
    assert check.passed


@pytest.fixture(scope="module")
def alternation(tmp_path_factory) -> tuple[Path, Path]:
    """A run trained to continue ``a b a b`` with ``a``, and its export."""
    root = tmp_path_factory.mktemp("alternation")
    run = alternation_run(root / "runs" / "alternation")
    return run, export(run, root / "hf" / "alternation").out


def test_transformers_generate_and_pipeline_decode_with_the_cache_on_a_trained_model(alternation):
    """transformers' own generate() (KV cache) and pipeline(), in a process without attnlab, on a
    model whose next token is the one two back: every step's logits equal a full forward's, and
    the tokens continue the prompt's alternation. A cache that reached the model under the wrong
    name (transformers 5 passes ``cache=``) leaves each step seeing only the newest token."""
    run, folder = alternation
    model, _, tok, _, _ = load_source(run)
    with torch.no_grad():  # the prompt decides the next token, not the last token alone
        after_q = [
            int(model(torch.tensor([tok.encode(p)])).logits[0, -1].argmax())
            for p in ("xqxq", "zqzq")
        ]
    assert [chr(t) for t in after_q] == ["x", "z"]
    (check,) = check_exports([(folder, model, tok)], text="xqxqxqxq", new_tokens=24)
    assert check.steps == 24
    assert check.max_abs_step_logits < 1e-4, check.sentence()
    new = bytes(check.transformers_tokens[check.prompt_tokens :]).decode()
    assert new == "xq" * 12, new
    assert check.greedy_equal and check.pipeline_equal, check.sentence()
    assert check.passed


def test_moe_and_virtual_heads_really_decode_with_the_cache(exported):
    """generate()'s DynamicCache holds one layer per attention slot (layers x loops); the cache is
    taken under its transformers 5 name (``cache``) and its 4.x name (``past_key_values``)."""
    from transformers import AutoModelForCausalLM, DynamicCache

    import attnlab.hf  # noqa: F401  (the local classes)

    for name, keyword in [("moe_values", "cache"), ("virtual_heads", "past_key_values")]:
        model = AutoModelForCausalLM.from_pretrained(exported[name])
        cfg = model.model.cfg
        cache = DynamicCache(config=model.config)
        ids = torch.arange(3, 13)[None]
        full = model(input_ids=ids, use_cache=False).logits
        first = model(input_ids=ids[:, :6], **{keyword: cache}).logits
        rest = model(input_ids=ids[:, 6:], **{keyword: cache}).logits
        assert cache.get_seq_length() == 10
        assert len(cache.layers) == cfg.n_layers * cfg.loops
        assert torch.allclose(torch.cat([first, rest], 1), full, atol=1e-5)


def test_folder_files(exported):
    folder = exported["baseline"]
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "attnlab"
    assert config["architectures"] == ["AttnlabForCausalLM"]
    assert config["auto_map"] == {
        "AutoConfig": "configuration_attnlab.AttnlabConfig",
        "AutoModelForCausalLM": "modeling_attnlab.AttnlabForCausalLM",
    }
    assert config["attnlab_model"]["d_model"] == 64
    # transformers 4.x leaves a value equal to its default out of config.json, so read it back
    assert AttnlabConfig.from_pretrained(folder).tie_word_embeddings is True
    assert AttnlabConfig.from_pretrained(exported["untied_biases_mqa"]).tie_word_embeddings is False
    gen = json.loads((folder / "generation_config.json").read_text())
    assert gen["eos_token_id"] == gen["bos_token_id"] == gen["pad_token_id"] == 256
    assert (folder / "tokenizer.json").is_file() and (folder / "tokenizer_config.json").is_file()
    # the remote code imports nothing of attnlab by absolute name
    for py in folder.glob("*.py"):
        for node in ast.walk(ast.parse(py.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                assert not node.module.startswith("attnlab"), (py.name, node.module)
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("attnlab.") for a in node.names), py.name
    card = (folder / "README.md").read_text()
    assert "library_name: transformers" in card and "## The run's config" in card
    assert "[model]" in card and "at step 5" in card and "- final_val_loss: 3.2100" in card


def test_tied_embeddings_are_stored_once(exported):
    def keys(name):
        with safe_open(exported[name] / "model.safetensors", "pt") as f:
            return set(f.keys())

    assert "model.embed.weight" in keys("baseline")
    assert "model.lm_head.weight" not in keys("baseline")
    assert {"model.embed.weight", "model.lm_head.weight"} <= keys("untied_biases_mqa")


def test_loads_without_trust_remote_code_when_attnlab_is_imported(exported):
    from transformers import AutoModelForCausalLM

    import attnlab.hf

    folder = exported["nonlinear_query"]
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert type(model) is attnlab.hf.AttnlabForCausalLM
    run_model, *_ = load_source(folder.parent.parent / "runs" / "nonlinear_query")
    ids = torch.arange(40, 60)[None]
    assert torch.equal(model(input_ids=ids).logits, run_model(ids).logits)
    assert model.model.lm_head.weight is model.model.embed.weight  # re-tied on load


def test_plugin_source_travels_with_the_folder(exported):
    folder = exported[PLUGIN]
    config = json.loads((folder / "config.json").read_text())
    (plugin,) = config["attnlab_plugins"]
    assert plugin["file"] == "plugins/hf_ideas.py"
    assert sorted(map(tuple, plugin["parts"])) == [
        ("query", "gated_hf", "GatedQuery"),
        ("side_branch", "low_rank_skip_hf", "LowRankSkip"),
    ]
    original = (folder.parent.parent / "lab" / "hf_ideas.py").read_text()
    assert (folder / "plugins" / "hf_ideas.py").read_text() == original
    flat = (folder / f"{plugin['flat_module']}.py").read_text()
    assert "from .attnlab_parts import" in flat and "from attnlab" not in flat


def test_plugin_export_loads_in_a_fresh_attnlab_process_from_its_copy(exported):
    """attnlab installed, the plugin not loaded: the folder's plugins/hf_ideas.py is, with the
    user's consent (trust_remote_code=True; refused without it: tests/hf/test_hostile_security.py)."""
    code = f"""
import attnlab.hf, torch
from transformers import AutoModelForCausalLM
from attnlab.parts import registry
model = AutoModelForCausalLM.from_pretrained({str(exported[PLUGIN])!r}, trust_remote_code=True)
assert type(model) is attnlab.hf.AttnlabForCausalLM
print(registry.get("query", "gated_hf").source)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith(str(exported[PLUGIN] / "plugins" / "hf_ideas.py"))


def test_right_padding_is_exact_and_left_padding_is_refused(exported):
    from transformers import AutoModelForCausalLM

    import attnlab.hf  # noqa: F401

    model = AutoModelForCausalLM.from_pretrained(exported["baseline"])
    ids = torch.arange(10, 22)[None].repeat(2, 1)
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    padded = model(input_ids=ids, attention_mask=mask).logits
    assert torch.allclose(padded[1, :8], model(input_ids=ids[1:, :8]).logits[0], atol=1e-5)
    with pytest.raises(ValueError, match="pad on the right"):
        model(input_ids=ids, attention_mask=mask.flip(1))


def test_export_refuses_bad_input(tmp_path, exported):
    with pytest.raises(UserError, match="does not exist"):
        export(tmp_path / "nothing", tmp_path / "out")
    (tmp_path / "plain").mkdir()
    with pytest.raises(UserError, match="not a run directory"):
        export(tmp_path / "plain", tmp_path / "out")
    run = exported["baseline"].parent.parent / "runs" / "baseline"
    with pytest.raises(UserError, match="holds an earlier export; pass --force"):
        export(run, exported["baseline_unfused"])
    enc = fake_run(tmp_path / "enc", ["model.family=encoder", "model.mask.kind=full"])
    with pytest.raises(
        UserError, match=r"only model\.family='decoder' or 'retrieval' models export"
    ):
        export(enc, tmp_path / "enc-hf")
    assert not (tmp_path / "enc-hf").exists()


def test_force_replaces_only_an_earlier_export_that_holds_nothing_else(tmp_path):
    """Issue 24: --force replaces attnlab's own export, never a file it did not write."""
    run = fake_run(tmp_path / "run", [], step=3)
    out = tmp_path / "hf"
    export(run, out)
    assert export(run, out, force=True).files  # an earlier export: replaced
    (out / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match=r"files the export did not write: notes\.txt"):
        export(run, out, force=True)
    assert (out / "notes.txt").read_text() == "mine"
    with pytest.raises(UserError, match="lies inside the run being exported"):
        export(run, run / "checkpoints" / "hf", force=True)
    other = fake_run(tmp_path / "other", [], step=3)
    with pytest.raises(UserError, match="lies inside the attnlab directory"):
        export(run, other / "hf", force=True)


@pytest.mark.fast
def test_export_of_one_checkpoint_and_the_cli(tmp_path, capsys):
    run = fake_run(tmp_path / "run", [], step=3)
    ckpt = run / "checkpoints" / "step_0000003"
    assert main(["export", str(ckpt), "--out", str(tmp_path / "hf")]) == 0
    out = capsys.readouterr().out
    assert "at step 3" in out and "modeling_attnlab.py" in out
    assert main(["export", str(ckpt), "--out", str(tmp_path / "hf")]) == 2
    assert "--force" in capsys.readouterr().err


LEARNED_GENERATE = """
import json, sys, warnings, torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True)
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    out = model.generate(torch.arange(3, 23)[None], max_new_tokens=30, do_sample=False)
try:
    model.generate(torch.arange(3, 43)[None], max_new_tokens=2, do_sample=False)
    refused = ""
except ValueError as e:
    refused = str(e)
print(json.dumps({"module": type(model).__module__, "length": out.shape[1],
                  "warnings": [str(w.message) for w in seen], "refused": refused}))
"""


def test_generate_past_learned_positions_stops_cleanly_at_the_limit(tmp_path):
    """Issue 32: transformers' generate() on an export with learned positions, asked for tokens
    past model.max_seq_len, stops at the limit with one warning naming it, in a process with
    attnlab (its class) and without (the folder's own code); a prompt already past the limit is a
    ValueError naming it. Before, generate() failed mid-way with a traceback."""
    overrides = ["model.position.kind=learned", "model.max_seq_len=32", "data.seq_len=32"]
    folder = export(fake_run(tmp_path / "run", overrides), tmp_path / "hf").out
    results = []
    for argv in (
        [sys.executable, "-c", "import attnlab.hf\n" + LEARNED_GENERATE],
        python_without_attnlab(LEARNED_GENERATE),
    ):
        env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules")}
        proc = subprocess.run(
            [*argv, str(folder)], capture_output=True, text=True, env=env, timeout=300
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert [r["module"].split(".")[0] for r in results] == ["attnlab", "transformers_modules"]
    for r in results:
        assert r["length"] == 32
        assert any("stopped at 32 tokens" in w for w in r["warnings"]), r["warnings"]
        assert "max_seq_len=32" in r["refused"]
