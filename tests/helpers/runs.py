"""Runs in child processes, and a run's numbers without its timings: shared by the CPU tests
(tests/train/test_kill.py, tests/runs/test_determinism.py) and their GPU versions (tests/gpu/)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from attnlab.runs.rundir import read_metrics, read_status

#: metrics fields that are measurements of time, not of the run's numbers
TIMING = {"tokens_per_s", "mfu", "elapsed", "step_time", "train_time"}


def numbers(run: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in read_metrics(run)]


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
