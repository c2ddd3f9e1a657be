"""A real ``attnlab train`` process killed with SIGKILL mid-run, then rerun: identical losses."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from attnlab.config import load_config
from attnlab.runs.rundir import read_metrics
from attnlab.train import train
from tests.helpers.data import prepare_bytes, run_config, word_corpus
from tests.helpers.runs import kill_then_rerun

STEPS = 60


def _losses(run: Path) -> list[tuple[int, float, float | None]]:
    return [(r["step"], r["loss"], r.get("val_loss")) for r in read_metrics(run)]


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
