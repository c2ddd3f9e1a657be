"""Experiment trackers (``train.loggers``): what a run writes to TensorBoard and to wandb (offline)
is read back with TensorBoard's event reader and from wandb's run log, and equals
``metrics.jsonl``, the config, the evaluation results and the final status."""

from __future__ import annotations

import hashlib
import json
import textwrap
from pathlib import Path

import pytest

from attnlab.cli import main
from attnlab.config import ConfigError, load_config
from attnlab.runs.rundir import read_metrics
from attnlab.runs.trackers import INSTALL, TrackerError
from attnlab.train import train
from tests.helpers.data import run_config, sentence_data
from tests.helpers.trackers import (
    tensorboard_scalars,
    tensorboard_tags,
    tensorboard_text,
    wandb_runs,
)

LOGGERS = '["tensorboard", "wandb"]'


@pytest.fixture(autouse=True)
def _offline_wandb(monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))  # no stored login: offline
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return sentence_data(tmp_path_factory.mktemp("trackers"))


def _same(got: list[tuple[int, float]], want: list[tuple[int, float]], rel: float) -> None:
    assert [s for s, _ in got] == [s for s, _ in want]
    assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=rel)


def _config(tmp_path: Path, data: Path, **train):
    settings = {
        "max_steps": 6,
        "batch_size": 4,
        "warmup_steps": 1,
        "eval_every": 3,
        "checkpoint_every": 3,
        "eval_batches": 2,
        "log_every": 2,
        "threads": 1,
        **train,
    }
    path = run_config(tmp_path / "run.toml", data.parent / "corpus.jsonl", data, **settings)
    return load_config(str(path), [f"train.loggers={LOGGERS}"])


def test_a_run_logs_metrics_config_and_status_to_both(tmp_path, data):
    run = tmp_path / "run"
    result = train(_config(tmp_path, data), run)
    assert result.status == "finished"
    rows = read_metrics(run)
    losses = [(r["step"], r["loss"]) for r in rows]
    vals = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
    assert [s for s, _ in losses] == [1, 2, 3, 4, 6]  # log_every 2, evaluations at 3 and 6

    tb = tensorboard_scalars(run / "tensorboard")
    assert [s for s, _ in tb["train/loss"]] == [s for s, _ in losses]
    assert [v for _, v in tb["train/loss"]] == pytest.approx([v for _, v in losses], rel=1e-6)
    _same(tb["val/loss"], vals, rel=1e-6)
    assert {"train/lr", "train/grad_norm", "train/tokens_per_s"} <= tb.keys()
    assert "[model]" in tensorboard_text(run / "tensorboard", "config")
    assert json.loads(tensorboard_text(run / "tensorboard", "status").strip("`\n"))["status"] == (
        "finished"
    )

    (wb,) = wandb_runs(run)
    assert wb.run_id == json.loads((run / "trackers.json").read_text())["state"]["wandb"]["id"]
    assert wb.name == "run" and wb.job_type == "train"
    assert wb.config["model"]["d_model"] == 64 and wb.config["train"]["max_steps"] == 6
    logged = [(h["_step"], h["train/loss"]) for h in wb.history if "train/loss" in h]
    assert [s for s, _ in logged] == [s for s, _ in losses]
    assert [v for _, v in logged] == pytest.approx([v for _, v in losses], rel=1e-9)
    _same([(h["_step"], h["val/loss"]) for h in wb.history if "val/loss" in h], vals, rel=1e-9)
    assert wb.summary["status"] == "finished"
    assert wb.summary["final_val_loss"] == pytest.approx(result.final_val_loss)
    assert wb.exit_code == 0


def test_evaluation_results_and_resumed_sessions_reach_the_same_runs(tmp_path, data):
    from attnlab.eval import evaluate

    run = tmp_path / "run"
    cfg = _config(tmp_path, data)
    assert train(cfg, run, _stop_after=3).status == "running"  # a killed session
    assert train(cfg, run).status == "finished"  # resumed
    evaluate(run, ["perplexity"], limit=2, device="cpu")

    sessions = wandb_runs(run)
    assert len(sessions) == 3 and len({s.run_id for s in sessions}) == 1  # one wandb run
    assert [h["_step"] for s in sessions[:2] for h in s.history if "train/loss" in h] == [
        1,
        2,
        3,
        4,
        6,
    ]
    ppl = sessions[2].history[0]
    assert ppl["_step"] == 6 and ppl["eval/perplexity/loss"] > 0
    results = json.loads((run / "eval" / "results.json").read_text())["tasks"]
    assert ppl["eval/perplexity/loss"] == pytest.approx(results["perplexity"]["metrics"]["loss"])
    tb = tensorboard_scalars(run / "tensorboard")
    _same(tb["eval/perplexity/loss"], [(6, ppl["eval/perplexity/loss"])], rel=1e-6)


def test_compare_groups_runs_by_experiment_and_variant_and_logs_the_plots(tmp_path, data):
    exp = tmp_path / "exp.toml"
    exp.write_text(
        textwrap.dedent(
            f"""
            name = "grouped"
            seeds = [0]
            [base]
            extends = "tiny"
            [base.data]
            dir = {json.dumps(str(data))}
            corpus = {json.dumps(str(data.parent / "corpus.jsonl"))}
            seq_len = 32
            [base.train]
            batch_size = 4
            warmup_steps = 1
            eval_every = 3
            eval_batches = 2
            threads = 1
            device = "cpu"
            loggers = {LOGGERS}
            [budget]
            steps = 3
            [[variants]]
            name = "baseline"
            [[variants]]
            name = "nlq"
            set = ["model.query.kind=nonlinear"]
            """
        )
    )
    out = tmp_path / "out"
    assert main(["compare", str(exp), "--out", str(out), "--quiet"]) == 0
    for variant in ("baseline", "nlq"):
        run = out / "runs" / variant / "seed0"
        assert "val/loss" in tensorboard_scalars(run / "tensorboard")
        (wb,) = wandb_runs(run)
        assert (wb.group, wb.job_type, wb.name) == ("grouped", variant, f"{variant}-seed0")
    (report,) = wandb_runs(out)
    assert (report.group, report.job_type) == ("grouped", "report")
    plots = {p.stem: p for p in (out / "plots").glob("*.png")}
    (logged,) = report.history
    assert plots
    for name, path in plots.items():  # the very PNG files of the report
        assert logged[f"report/{name}/_type"] == "image-file"
        assert logged[f"report/{name}/sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert set(tensorboard_tags(out / "tensorboard")["images"]) == {f"report/{p}" for p in plots}


def test_a_missing_client_names_the_install_command(tmp_path, data, monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    with pytest.raises(TrackerError, match=r"pip install 'attnlab\[trackers\]'"):
        train(_config(tmp_path, data), tmp_path / "run")
    assert not (tmp_path / "run" / "checkpoints").exists()
    cfg = tmp_path / "run.toml"
    code = main(
        ["train", str(cfg), "--out", str(tmp_path / "r2"), "--set", 'train.loggers=["wandb"]']
    )
    assert code == 2 and INSTALL in capsys.readouterr().err


def test_every_missing_client_is_named_and_nothing_is_written(tmp_path, monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    blocked = {"wandb", "tensorboard"}
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in blocked else real(name, *a)
    )
    out = tmp_path / "run"
    loggers = 'train.loggers=["jsonl", "tensorboard", "wandb"]'
    code = main(["train", "tiny", "--out", str(out), "--set", loggers, "--set", "train.device=cpu"])
    err = capsys.readouterr().err
    assert code == 2 and "(missing: tensorboard, wandb)" in err and INSTALL in err
    assert not out.exists()  # no bare config.toml, no lock file


def test_loggers_are_validated_and_jsonl_is_the_default():
    assert load_config("tiny").train.loggers == ["jsonl"]
    with pytest.raises(ConfigError, match="tensorboard"):
        load_config("tiny", ['train.loggers=["tensorbord"]'])
