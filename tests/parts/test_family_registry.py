"""Model families are registered assemblies: no code outside the family files branches on a
family's name, the registry refuses what it cannot use and names the nearest spelling, and a
family of one's own (examples/prefix_lm.py, one file) runs through train, eval, generate and
export like a built-in one."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from attnlab.cli import main
from attnlab.config import ConfigError, load_config
from attnlab.data.byte_tokenizer import ByteTokenizer
from attnlab.eval.native import AttnlabLM
from attnlab.model import build_model
from attnlab.parts import PluginError, families, load_plugin
from attnlab.testing.cases import all_cases
from tests.helpers.paths import EXAMPLES, PACKAGE

SRC = PACKAGE
EXAMPLE = EXAMPLES / "prefix_lm.py"
BUILTIN = ("decoder", "encoder", "encoder_decoder", "retrieval")
_ALT = "|".join(BUILTIN)
#: a branch on a family: a comparison or membership test of a ``family``/``fam`` value, or of
#: a family's name in quotes
BRANCH = re.compile(
    rf"""\bfam\w*\s*(==|!=|\bnot in\b|\bin\b)"""
    rf"""|["']({_ALT})["']\s*(==|!=|\bin\b)"""
    rf"""|(==|!=|\bin\s*[(\[{{])\s*["']({_ALT})["']"""
)


def test_no_code_outside_the_family_files_branches_on_a_family() -> None:
    """Every question about a family (can it decode? does it export? what does it train
    with?) is asked of the family; only ``model/families/`` names one to compare it."""
    hits = []
    for path in sorted(SRC.rglob("*.py")):
        if path.is_relative_to(SRC / "model" / "families"):
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if BRANCH.search(line):
                hits.append(f"{path.relative_to(SRC)}:{n}: {line.strip()}")
    assert not hits, "\n".join(hits)


def test_the_grep_would_catch_a_branch_on_a_family() -> None:
    assert BRANCH.search('if cfg.model.family not in ("decoder", "retrieval"):')
    assert BRANCH.search("if model.family != 'encoder':")
    assert BRANCH.search('    H, fam = 4, "x"; ok = fam == "decoder"')
    assert BRANCH.search('if "retrieval" == cfg.model.family:')
    assert BRANCH.search("kinds = x if name in ['encoder', 'decoder'] else y")
    assert not BRANCH.search("family = families.of(cfg.model)")
    assert not BRANCH.search('StackPlan("decoder", cfg.n_layers, causal=True)')


def test_the_builtin_families_are_registered_from_their_files() -> None:
    assert families.names()[:4] == list(BUILTIN)
    for name in BUILTIN:
        spec = families.spec(name)
        assert spec.source == "built-in"
        assert spec.cls.__module__ == f"attnlab.model.families.{name}"
    assert families.get("retrieval").needs("neighbours")
    assert not families.get("encoder").continues_text


def test_a_plugin_that_imports_a_builtin_family_first_leaves_it_builtin(tmp_path: Path) -> None:
    """In a fresh interpreter the plugin's own ``from attnlab.model.families.decoder import
    Decoder`` is the first use of the registry: the decoder is still recorded as built-in,
    listed first, and the plugin's family under the plugin."""
    import subprocess
    import sys

    code = (
        "import json, sys\n"
        "from attnlab.parts import families, load_plugin\n"
        "load_plugin(sys.argv[1])\n"
        "print(json.dumps([[s.name, s.source] for s in families.specs()]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(EXAMPLE)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    listed = json.loads(proc.stdout)
    assert listed == [[n, "built-in"] for n in BUILTIN] + [["prefix_lm", str(EXAMPLE)]]


def test_an_unknown_family_names_the_nearest_spelling_and_the_families() -> None:
    with pytest.raises(ConfigError) as e:
        load_config("tiny", ["model.family=encodr"])
    msg = str(e.value)
    assert "'model.family': 'encodr' is not a registered model family" in msg
    assert "did you mean 'encoder'?" in msg and "'encoder_decoder', 'retrieval'" in msg
    assert "--plugin" in msg


def _plugin(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(
        "from attnlab.model.families.decoder import Decoder\n"
        "from attnlab.parts import register_family\n\n" + body
    )
    return path


def test_a_family_name_taken_twice_is_refused_naming_both(tmp_path: Path) -> None:
    clash = _plugin(
        tmp_path, "clash", '@register_family("decoder")\nclass Mine(Decoder):\n    pass\n'
    )
    with pytest.raises(PluginError) as e:
        load_plugin(str(clash))
    msg = str(e.value)
    assert "family 'decoder' is already registered by built-in" in msg
    assert "attnlab.model.families.decoder.Decoder" in msg and "Choose another family name" in msg
    assert families.spec("decoder").cls.__name__ == "Decoder"  # nothing was overwritten


def test_a_family_that_cannot_be_used_is_refused_with_its_declarations(tmp_path: Path) -> None:
    bad = _plugin(
        tmp_path,
        "bad_family",
        "from attnlab.parts import Family\n\n"
        '@register_family("half")\nclass Half(Family):\n    data_needs = ("images",)\n',
    )
    with pytest.raises(PluginError) as e:
        load_plugin(str(bad))
    msg = str(e.value)
    assert "Half registered as family 'half' cannot be used" in msg
    for said in ("objective must be an Objective", "no stacks(cfg)", "no route(", "'images'"):
        assert said in msg
    assert not families.has("half")


# --------------------------------------------------------------------- the prefix-LM plugin


@pytest.fixture(scope="module")
def prefix_lm(tmp_path_factory) -> Path:
    """examples/prefix_lm.py copied into this module's folder (its own module name here)."""
    path = tmp_path_factory.mktemp("family") / "prefix_lm.py"
    shutil.copyfile(EXAMPLE, path)
    return path


def _cfg(prefix_lm: Path, *sets: str):
    base = ["model.family=prefix_lm", "model.mask.prefix_len=4", "model.n_layers=1"]
    return load_config("tiny", [*base, *sets], plugins=[str(prefix_lm)])


def test_the_example_family_settles_its_mask_and_refuses_another(prefix_lm: Path) -> None:
    cfg = _cfg(prefix_lm)
    assert cfg.model.mask.kind == "prefix" and families.spec("prefix_lm").source == str(prefix_lm)
    causal = ["model.family=prefix_lm", "model.mask.kind=causal", "model.n_layers=1"]
    with pytest.raises(ConfigError, match=r"model\.family='prefix_lm' reads its prefix both ways"):
        load_config("tiny", causal, plugins=[str(prefix_lm)])
    assert "prefix_lm/prefix/learned" in [c.name for c in all_cases()]  # its check cases


def test_the_prefix_lm_trains_on_the_tokens_after_its_prefix(prefix_lm: Path) -> None:
    from attnlab.train.objectives import make_batch, resolve_objective

    cfg = _cfg(prefix_lm)
    objective = resolve_objective(cfg.model, cfg.train)
    x = torch.arange(2 * 12).view(2, 12).numpy()
    batch = make_batch(
        objective, x[:, :-1], x[:, 1:], None, vocab=288, mask_prob=0.15, eos_id=None,
        model=cfg.model,
    )  # fmt: skip
    assert objective == "prefix_lm"
    assert (batch.targets[:, :3] == -100).all()  # positions 0..P-2 would read their answer
    assert torch.equal(batch.targets[:, 3:], torch.from_numpy(x[:, 4:]))


def test_the_prefix_lm_is_scored_with_position_t_reading_tokens_up_to_t(prefix_lm: Path) -> None:
    """The language-model tasks need logits where position t depends on tokens <= t only; the
    prefix LM's plain forward breaks that inside its prefix, its ``score_logits`` keeps it."""
    cfg = _cfg(prefix_lm)
    torch.manual_seed(0)
    model = build_model(cfg.model).eval()
    family = families.of(cfg.model)
    x = torch.randint(0, 200, (2, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        scored = family.score_logits(model, x)
        plain = model(x).logits
        for t in range(10):
            y = x.clone()
            y[:, t + 1 :] = (y[:, t + 1 :] + 1) % 200  # every later token changed
            assert torch.allclose(family.score_logits(model, y)[:, t], scored[:, t], atol=1e-5)
        y = x.clone()
        y[:, 1] = (y[:, 1] + 1) % 200
        assert not torch.allclose(model(y).logits[:, 0], plain[:, 0])  # the plain forward peeks
    assert torch.allclose(scored[:, 3:], plain[:, 3:])  # after the prefix they are the same
    lm = AttnlabLM(model, ByteTokenizer(), 16, device="cpu")
    assert torch.allclose(lm.logits(x), scored, atol=1e-6)
    # a caller that reads positions 2.. only spares the forwards of 0 and 1, and gets the rest
    assert torch.allclose(lm.scored_logits(x, None, 2)[:, 2:], scored[:, 2:], atol=1e-6)


def _attnlab(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """``attnlab ARGS`` in this process (the working directory is the test's): its stdout."""
    capsys.readouterr()
    assert main(list(args)) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return out


def test_the_prefix_lm_plugin_runs_through_train_eval_generate_and_export(
    tmp_path: Path, prefix_lm: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """The commands' own entry point, in process, on a 1-layer tiny model for 2 steps; the
    family comes from the config's plugins list, as a user's does. The export is then loaded by
    transformers in a fresh interpreter where attnlab cannot be imported."""
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "run.toml"
    cfg.write_text(
        f'extends = "tiny"\nplugins = [{json.dumps(str(prefix_lm))}]\n'
        '[model]\nfamily = "prefix_lm"\nn_layers = 1\nmask.prefix_len = 4\n'
        f"[data]\ncorpus = {json.dumps(str(data_dir.parent / 'corpus.jsonl'))}\n"
        f"dir = {json.dumps(str(data_dir))}\nseq_len = 32\n"
        "[train]\nmax_steps = 2\nbatch_size = 2\nwarmup_steps = 1\neval_every = 2\n"
        "eval_batches = 1\ncheckpoint_every = 2\nlog_every = 1\ndevice = 'cpu'\n"
    )
    families_out = _attnlab(capsys, "parts", "family", "--json", "--plugin", str(prefix_lm))
    row = next(r for r in json.loads(families_out) if r["family"] == "prefix_lm")
    assert row["objective"] == "prefix_lm" and row["source"] == str(prefix_lm)
    _attnlab(capsys, "train", str(cfg), "--out", "run", "--quiet")
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["status"] == "finished" and status["objective"] == "prefix_lm"
    _attnlab(capsys, "eval", "run", "--tasks", "perplexity", "--limit", "2", "--no-progress")
    results = json.loads((tmp_path / "run" / "eval" / "results.json").read_text())
    assert results["tasks"]["perplexity"]["metrics"]["tokens"] > 0
    out = _attnlab(capsys, "generate", "run", "--prompt", "the cat sat", "--max-new-tokens",
                   "8", "--temperature", "0")  # fmt: skip
    assert out.startswith("the cat sat")
    pytest.importorskip("transformers")
    _attnlab(capsys, "export", "run", "--out", "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (plugin,) = config["attnlab_plugins"]
    assert plugin["parts"] == [["family", "prefix_lm", "PrefixLM"]]
    assert (tmp_path / "hf" / "plugins" / "prefix_lm.py").read_bytes() == EXAMPLE.read_bytes()

    from attnlab.hf.export import load_source
    from attnlab.hf.verify import check_exports

    model, _, tok, _, _ = load_source(tmp_path / "run")
    (check,) = check_exports([(tmp_path / "hf", model, tok)], new_tokens=6, pipeline=False)
    assert check.passed, check.sentence()
