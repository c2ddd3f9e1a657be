"""A real ``attnlab train`` process killed with SIGKILL mid-run, then rerun: identical losses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnlab.config import load_config
from attnlab.runs.rundir import read_metrics, read_status
from attnlab.train import train
from data_helpers import prepare_bytes, run_config, word_corpus

STEPS = 60


def _losses(run: Path) -> list[tuple[int, float, float | None]]:
    return [(r["step"], r["loss"], r.get("val_loss")) for r in read_metrics(run)]


def attnlab_train_cmd(cfg: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "attnlab", "train", str(cfg), "--out", str(out), "--quiet"]


def kill_then_rerun(cfg: Path, run: Path, *, kill_after: int, max_steps: int) -> None:
    """``attnlab train`` in a subprocess, SIGKILLed once ``kill_after`` steps are logged, then run
    again to the end: checks that it was cut short, resumed, and finished."""
    cmd = attnlab_train_cmd(cfg, run)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            rows = read_metrics(run)
            if rows and rows[-1]["step"] >= kill_after:
                break
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    killed_at = read_metrics(run)[-1]["step"]
    assert killed_at < max_steps and read_status(run)["status"] == "running"

    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "resumed from step" in done.stdout
    assert read_status(run)["status"] == "finished"


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
@pytest.mark.parametrize("deterministic", [False, True])
def test_sigkill_then_rerun_equals_an_uninterrupted_run(tmp_path, deterministic):
    words = ["red", "green", "blue", "light", "dark", "sky", "sea", "land", "tree", "stone"]
    corpus = word_corpus(tmp_path / "c.jsonl", words, n_docs=60, length=60, seed=5)
    cfg = run_config(
        tmp_path / "cfg.toml",
        corpus,
        prepare_bytes(corpus, tmp_path / "data"),
        max_steps=STEPS,
        batch_size=4,
        warmup_steps=4,
        log_every=1,
        eval_every=10,
        checkpoint_every=3,
        eval_batches=2,
        threads=1,
        deterministic=deterministic,
    )
    run = tmp_path / "killed"
    kill_then_rerun(cfg, run, kill_after=14, max_steps=STEPS)
    ref = tmp_path / "ref"
    train(load_config(str(cfg)), ref)
    assert _losses(run) == _losses(ref)
