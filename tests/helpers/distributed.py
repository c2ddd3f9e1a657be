"""What the torchrun tests share: a tiny byte-level training setup, a torchrun launch of `attnlab
train`, and the step-by-step comparison of a multi-process run against one process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab.runs.rundir import read_metrics
from tests.helpers.data import prepare_bytes, run_config, word_corpus

WORDS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]


def tiny_training(root: Path, steps: int, **extra) -> Path:
    """Write a byte-level corpus, its prepared data and a config training ``steps`` steps of 256
    tokens (batches of 4, eval and checkpoint every 2 steps) under ``root``; return the config."""
    corpus = word_corpus(root / "c.jsonl", WORDS, n_docs=60, length=50, seed=2)
    return run_config(
        root / "cfg.toml",
        corpus,
        prepare_bytes(corpus, root / "data"),
        max_steps=steps,
        batch_size=4,
        tokens_per_step=256,
        warmup_steps=1,
        log_every=1,
        eval_every=2,
        checkpoint_every=2,
        eval_batches=2,
        **extra,
    )


def torchrun_train(cfg: Path, out: Path, nproc: int, *extra: str, timeout: int = 400) -> None:
    """Run ``attnlab train CFG --out OUT --quiet EXTRA`` under ``torch.distributed.run`` with
    ``nproc`` local processes of one thread each; fail with the run's output on a non-zero exit."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc_per_node={nproc}", "-m", "attnlab", "train", str(cfg), "--out", str(out)]
    cmd += ["--quiet", *extra]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]


def assert_same_steps(single: Path, other: Path, steps: int, rel: float = 1e-5) -> None:
    """Both runs logged steps 1..``steps`` with equal losses (``rel``), gradient norms (1e-4) and
    validation losses at the same steps."""
    a, b = read_metrics(single), read_metrics(other)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, steps + 1))
    for ra, rb in zip(a, b):
        assert rb["loss"] == pytest.approx(ra["loss"], rel=rel, abs=1e-6)
        assert rb["grad_norm"] == pytest.approx(ra["grad_norm"], rel=1e-4)
        assert ("val_loss" in ra) == ("val_loss" in rb)
        if "val_loss" in ra:
            assert rb["val_loss"] == pytest.approx(ra["val_loss"], rel=rel)
