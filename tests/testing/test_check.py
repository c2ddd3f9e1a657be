"""The conformance check (``attnlab.testing``, ``attnlab check``, the gate before a run) catches
each fault a part can have with its own message (the property, the number, the fix), runs as a
command over every part, and stops a run on a faulty plugin unless told not to. That every
built-in part and the examples pass every property is tests/testing/test_battery.py's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab.cli import main
from attnlab.parts import registry
from attnlab.parts.plugins import load_plugin
from attnlab.testing import PROPERTIES, check_part
from attnlab.testing.cases import BASE
from tests.helpers.check import write_fault
from tests.helpers.data import run_config
from tests.helpers.paths import ROOT

EXAMPLES = [ROOT / "examples" / f for f in ("my_ideas.py", "softcap.py", "causal_mean.py")]
D = BASE["model"]["d_model"]


def attnlab(*args: str, cwd: Path | None = None, timeout: float = 600):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "attnlab", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def faults(tmp_path_factory) -> dict[str, tuple[Path, str, str]]:
    """fault -> (plugin file, slot, kind), each file loaded in this process."""
    folder = tmp_path_factory.mktemp("faults")
    out = {}
    for fault in ("cache", "params", "causality", "compile", "flops"):
        path, slot, kind = write_fault(folder, fault, "t")
        load_plugin(str(path))
        out[fault] = (path, slot, kind)
    return out


def _failed(report) -> set[str]:
    return {r.name for r in report.failures()}


def test_a_time_mixing_side_branch_that_claims_the_cache_fails_kv_cache(faults):
    """The user trial: a gated causal mean with supports_kv_cache still True. It is causal, so
    only cached decoding is wrong, and the message says which declaration to change."""
    _, slot, kind = faults["cache"]
    report = check_part(slot, kind, compile=False, export=False)
    assert _failed(report) == {"kv_cache"}, report.summary()
    r = report.result("kv_cache")
    assert r.measured > 1e-3 and r.limit == 1e-9
    msg = r.message()
    assert msg.startswith("kv_cache: token-by-token decoding differs from the full forward by ")
    assert f"{r.measured:.3g}" in msg
    assert f"{slot}.{kind} declares supports_kv_cache = True" in msg
    assert "must declare supports_kv_cache = False, or keep what the cache needs" in msg
    assert report.result("causality").status == "passed"


@pytest.mark.fast
def test_a_query_whose_declared_parameters_are_off_by_one_fails_params(faults):
    _, slot, kind = faults["params"]
    report = check_part(slot, kind, compile=False, export=False)
    assert _failed(report) == {"params"}, report.summary()
    r = report.result("params")
    assert r.measured == 1.0
    assert f"declares {D * D + 1:,} parameters" in r.message()
    assert f"holds {D * D:,} (off by +1)" in r.message()
    assert "make param_count the formula of what __init__ builds" in r.message()


def test_a_score_part_that_leaks_the_future_fails_causality(faults):
    _, slot, kind = faults["causality"]
    report = check_part(slot, kind, compile=False, export=False)
    r = report.result("causality")
    assert r.status == "failed", report.summary()
    assert r.measured > 1e-3
    msg = r.message()
    assert "changing the tokens at and after position" in msg
    assert f"changed the outputs before it by {r.measured:.3g}" in msg
    assert f"{slot}.{kind} lets a position read later ones" in msg
    assert "ctx.allowed / ctx.is_causal" in msg
    assert "[decoder/" in msg  # the config it was caught in
    # reading the future also breaks what depends on it, each with its own message
    assert _failed(report) <= {"causality", "kv_cache", "batch"}


def test_a_part_whose_compiled_output_differs_fails_compile(faults):
    _, slot, kind = faults["compile"]
    report = check_part(slot, kind, compile=True, export=False)
    assert _failed(report) == {"compile"}, report.summary()
    r = report.result("compile")
    assert r.measured > 1e-3
    assert f"the compiled {slot}.{kind} differs from eager by {r.measured:.3g}" in r.message()
    assert "torch.compiler.is_compiling()" in r.message()


def test_undeclared_flops_beyond_the_linears_fail_with_extra_flops_as_the_fix(faults):
    _, slot, kind = faults["flops"]
    report = check_part(slot, kind, compile=False, export=False)
    assert _failed(report) == {"flops"}, report.summary()
    r = report.result("flops")
    assert f"{2 * D * D:,} FLOPs per token and layer measured by FlopCounterMode" in r.message()
    assert f"{slot}.{kind} declares 0" in r.message()
    assert "declare the matmul FLOPs beyond its Linears in extra_flops(seq_len)" in r.message()
    assert r.measured == pytest.approx(1.0)


def test_every_property_is_reported_with_a_reason_for_each_skip():
    report = check_part("side_branch", "content_skip", compile=False, export=False)
    assert [r.name for r in report.results] == list(PROPERTIES)
    assert report.passed, report.summary()
    for r in report.results:
        assert r.status in ("passed", "skipped") and r.detail
    assert "not asked for (--no-compile)" in report.result("compile").detail
    assert report.result("gradcheck").detail.endswith(
        "applies no torch.autograd.Function of its own"
    )
    assert "encoder/full/learned" in report.cases
    assert "encoder_decoder/causal/learned" in report.cases


def test_refused_configs_are_reported_with_the_part_s_own_reason():
    report = check_part("value", "moe", compile=False, export=False)
    refused = dict(report.refused)
    assert "implemented for model.family='decoder' only" in refused["encoder/full/learned"]
    assert all(c.startswith("decoder/") for c in report.cases)
    assert report.passed, report.summary()
    assert "_Dispatch" in report.result("gradcheck").detail  # its hand-written backwards


def test_gradcheck_catches_a_wrong_hand_written_backward(tmp_path):
    path = tmp_path / "bad_backward.py"
    path.write_text(
        """
import torch
from attnlab.parts import SideBranchPart, register


class _Twice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return 2 * x

    @staticmethod
    def backward(ctx, g):
        return 3 * g  # wrong: d(2x)/dx = 2


@register("side_branch", "bad_backward")
class BadBackward(SideBranchPart):
    @classmethod
    def param_count(cls, opts, dims):
        return 0

    def forward(self, x):
        return _Twice.apply(x)
"""
    )
    load_plugin(str(path))
    report = check_part("side_branch", "bad_backward", compile=False, export=False)
    assert _failed(report) == {"gradcheck"}, report.summary()
    msg = report.result("gradcheck").message()
    assert "torch.autograd.gradcheck fails on _Twice.backward: Jacobian mismatch" in msg
    assert "make _Twice.backward return the gradient of its forward" in msg


def test_the_cli_reports_a_failure_with_exit_1_and_bad_input_with_exit_2(faults, capsys):
    """The failure through the console command; bad input through ``main`` in this process
    (what it prints is the command's, without a Python start per case)."""
    path, slot, _ = faults["cache"]
    p = attnlab("check", "--plugin", str(path), "--no-compile", "--no-export")
    assert p.returncode == 1, p.stdout + p.stderr
    assert f"{slot}.gated_mean_t kv_cache: token-by-token decoding differs" in " ".join(
        p.stdout.split()
    )
    assert "1 of 1 part(s) failed 1 propert(ies)" in p.stdout
    for args, words in (
        (["query:nonlinr"], "did you mean 'nonlinear'"),
        (["qurey:linear"], "unknown slot 'qurey'"),
        (["query"], "is not SLOT:KIND"),
        (["query:nonlinear,ratio=-1"], "bad option (ratio"),
        (["query:nonlinear,colour=red"], "bad option (colour"),
    ):
        assert main(["check", *args, "--no-compile", "--no-export"]) == 2, args
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1, err


def test_check_all_as_a_command_covers_every_part_and_the_examples():
    """``attnlab check --all`` as a command: every registered part and the README's example
    plugins, with the fast options (no torch.compile, no export). Every property of every part,
    compile and export included, is tests/testing/test_battery.py's, one pytest item each."""
    plugins = [a for f in EXAMPLES for a in ("--plugin", str(f))]
    p = attnlab("check", "--all", *plugins, "--no-compile", "--no-export", "--json", "-q")
    assert "Traceback" not in p.stderr, p.stderr
    reports = json.loads(p.stdout)
    bad = [
        f"{r['slot']}.{r['kind']}: {x['name']}: {x['detail']} {x['fix']}"
        for r in reports
        for x in r["results"]
        if x["status"] == "failed"
    ]
    assert p.returncode == 0 and not bad, "\n".join(bad)
    checked = {(r["slot"], r["kind"]) for r in reports}
    builtins = {(s.slot, s.kind) for s in registry.specs() if s.source == registry.BUILTIN}
    assert builtins <= checked
    assert {("query", "gated"), ("score", "softcap"), ("side_branch", "causal_mean")} <= checked
    for r in reports:
        statuses = {x["name"]: (x["status"], x["detail"]) for x in r["results"]}
        assert list(statuses) == list(PROPERTIES), r["kind"]
        assert statuses["compile"] == ("skipped", "not asked for (--no-compile)")
        assert statuses["export"] == ("skipped", "not asked for (--no-export)")
        assert statuses["causality"][0] == "passed", (r["slot"], r["kind"])


def _train_args(tmp_path: Path, data_dir: Path, plugin: Path, kind: str, out: str) -> list[str]:
    cfg = run_config(
        tmp_path / "run.toml",
        data_dir.parent / "corpus.jsonl",
        data_dir,
        max_steps=2,
        batch_size=2,
        warmup_steps=1,
        eval_every=2,
        eval_batches=1,
        checkpoint_every=2,
        log_every=1,
    )
    return [
        "train", str(cfg), "--out", str(tmp_path / out), "--quiet", "--plugin", str(plugin),
        "--set", f"model.side_branch.kind={kind}",
    ]  # fmt: skip


def test_train_stops_on_a_failing_plugin_part_and_records_a_skip(tmp_path, data_dir, capsys):
    path, _, kind = write_fault(tmp_path / "lab", "cache", "gate")
    args = _train_args(tmp_path, data_dir, path, kind, "runs/bad")
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"the conformance check fails on side_branch.{kind}" in err
    assert "kv_cache: token-by-token decoding differs from the full forward" in err
    assert "--skip-check runs anyway" in err
    assert not (tmp_path / "runs" / "bad").exists()  # refused before anything was written
    assert main([*args, "--skip-check"]) == 0
    record = json.loads((tmp_path / "runs" / "bad" / "check.json").read_text())
    assert record["skipped"] is True and record["by"] == "--skip-check"
    assert record["parts"] == [{"slot": "side_branch", "kind": kind, "options": {}}]


def test_a_passing_plugin_part_is_checked_once_per_source(tmp_path, data_dir, check_cache):
    plugin = tmp_path / "lab" / "mean_ok.py"
    plugin.parent.mkdir()
    plugin.write_text(
        (ROOT / "examples" / "causal_mean.py").read_text().replace('"causal_mean"', '"mean_ok"')
    )
    first = _train_args(tmp_path, data_dir, plugin, "mean_ok", "runs/a")
    assert main(first) == 0
    rec = json.loads((tmp_path / "runs" / "a" / "check.json").read_text())
    assert rec["skipped"] is False and rec["parts"][0]["result"] == "passed"
    assert (check_cache / f"{rec['parts'][0]['key']}.json").is_file()
    assert main(_train_args(tmp_path, data_dir, plugin, "mean_ok", "runs/b")) == 0
    rec = json.loads((tmp_path / "runs" / "b" / "check.json").read_text())
    assert rec["parts"][0]["result"] == "passed (cached)"


def test_nothing_below_the_commands_imports_the_check():
    """The battery sits above model, parts, runs and hf: none of them imports attnlab.testing
    (an exported model's code, copied from attnlab's model sources, never needs it)."""
    import ast

    import attnlab

    src = Path(attnlab.__file__).parent
    offenders = []
    for package in ("model", "parts", "runs", "hf", "data", "train", "probe", "eval", "bench"):
        for path in sorted((src / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = []
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                offenders += [
                    f"{path.relative_to(src)} imports {n}"
                    for n in names
                    if n == "attnlab.testing" or n.startswith("attnlab.testing.")
                ]
    assert offenders == []
