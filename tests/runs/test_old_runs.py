"""A run directory written before positions and norms became slots (main at 156143a) resumes,
evaluates and exports with today's code (``tests/fixtures/old_run_156143a``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from attnlab.cli import main
from attnlab.config import dump_toml, load_config
from attnlab.runs import rundir
from attnlab.runs.checkpoint import _seal
from tests.helpers.data import sentence_data
from tests.helpers.paths import FIXTURES

FIXTURE = FIXTURES / "old_run_156143a"
WRITTEN_AT = "/tmp/f26_fix"  # the folder the old code ran in; its absolute paths are in the run


def _old_run(tmp: Path) -> Path:
    """The fixture copied to ``tmp`` (the working directory), its absolute paths moved there,
    and its data prepared again from the same sentences (relative paths, as recorded)."""
    shutil.copytree(FIXTURE, tmp, dirs_exist_ok=True)
    run = tmp / "run"
    for f in (run / "config.toml", run / "status.json"):
        f.write_text(f.read_text().replace(WRITTEN_AT, str(tmp)))
    state = run / "checkpoints" / "step_0000004" / "state.json"
    moved = json.loads(state.read_text().replace(WRITTEN_AT, str(tmp)))
    state.write_text(json.dumps(_seal(moved), indent=1))
    (tmp / "data").mkdir()
    sentence_data(Path("data"))
    return run


@pytest.fixture
def old_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return _old_run(tmp_path)


def test_an_old_recorded_config_compares_equal_to_the_same_config_loaded_today(
    old_run: Path,
) -> None:
    recorded = (old_run / "config.toml").read_text()
    assert "rope_base" in recorded and "grad_noise" not in recorded  # really the old format
    given = load_config("run.toml")
    given.data.dir = str(Path("data/prepared").resolve())  # as train resolves it
    text = dump_toml(given)
    assert rundir.config_conflicts(old_run, text)  # compared key by key, it would refuse
    assert rundir.config_conflicts(old_run, text, upgrade=rundir.in_todays_keys) == []
    today = rundir.in_todays_keys(rundir.parse_config_text(recorded))
    assert rundir.config_diff(today, rundir.parse_config_text(text)) == []


def test_an_old_run_resumes_evaluates_and_exports_with_todays_code(
    old_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = json.loads((old_run / "status.json").read_text())
    assert (before["status"], before["step"], before["max_steps"]) == ("running", 4, 8)
    assert main(["train", "run.toml", "--out", "run", "--quiet"]) == 0
    status = json.loads((old_run / "status.json").read_text())
    assert (status["status"], status["step"]) == ("finished", 8)
    assert status["resumed_from"] == 4
    lines = [json.loads(x) for x in (old_run / "metrics.jsonl").read_text().splitlines()]
    steps = [x["step"] for x in lines if "loss" in x and "step" in x]
    assert steps[:4] == [1, 2, 3, 4] and steps[-1] == 8 and len(set(steps)) == len(steps)
    assert main(["eval", "run", "--tasks", "perplexity", "--limit", "2", "--no-progress"]) == 0
    results = json.loads((old_run / "eval" / "results.json").read_text())
    assert results["tasks"]["perplexity"]["metrics"]["loss"] > 0
    pytest.importorskip("transformers")
    assert main(["export", "run", "--out", "hf"]) == 0
    config = json.loads((old_run.parent / "hf" / "config.json").read_text())
    assert config["model_type"] == "attnlab"
    assert "exported run at step 8" in capsys.readouterr().out


def test_an_old_run_given_another_config_is_still_refused_naming_only_that_key(
    old_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["train", "run.toml", "--out", "run", "--quiet", "--set", "train.lr=0.01"])
    err = capsys.readouterr().err
    assert code == 2 and "different config" in err
    assert "train.lr: 0.003 -> 0.01" in err
    assert "grad_noise" not in err and "rope_base" not in err and "block_size" not in err
    assert json.loads((old_run / "status.json").read_text())["step"] == 4


def test_an_old_run_evaluates_generates_and_exports_without_resuming(
    old_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The step-4 checkpoint and the old config files as written, read by today's loaders."""
    assert main(["eval", "run", "--tasks", "perplexity", "--limit", "2", "--no-progress"]) == 0
    results = json.loads((old_run / "eval" / "results.json").read_text())
    assert results["tasks"]["perplexity"]["metrics"]["loss"] > 0
    capsys.readouterr()
    args = ["generate", "run", "--prompt", "the", "--max-new-tokens", "8", "--temperature", "0"]
    assert main(args) == 0
    assert capsys.readouterr().out.strip()
    assert "rope_base" in (old_run / "config.toml").read_text()  # nothing rewritten
    pytest.importorskip("transformers")
    assert main(["export", "run", "--out", "hf"]) == 0
    assert "exported run at step 4" in capsys.readouterr().out
