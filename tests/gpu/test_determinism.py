"""``train.deterministic`` on the GPU: two identical ``attnlab train`` runs (bf16 autocast,
torch.compile) write the same metrics, bit for bit, and a run SIGKILLed mid-way and resumed writes
the same metrics as an uninterrupted one. Every run is its own process, as a user's would be:
``CUBLAS_WORKSPACE_CONFIG`` must be in place before a process's first cuBLAS call."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from attnlab.runs.rundir import read_metrics, read_status
from tests.helpers.data import prepare_bytes, run_config, word_corpus
from tests.helpers.gpu import DEVICE
from tests.helpers.runs import attnlab_train_cmd, kill_then_rerun, numbers

pytestmark = pytest.mark.gpu

STEPS = 60


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gpu-det")
    words = ["red", "green", "blue", "light", "dark", "sky", "sea", "land", "tree", "stone"]
    corpus = word_corpus(root / "c.jsonl", words, n_docs=80, length=80, seed=5)
    return run_config(
        root / "cfg.toml",
        corpus,
        prepare_bytes(corpus, root / "data"),
        seq_len=64,
        max_steps=STEPS,
        batch_size=8,
        warmup_steps=10,
        log_every=1,
        eval_every=20,
        checkpoint_every=5,
        eval_batches=2,
        threads=1,  # as kill_then_rerun's OMP_NUM_THREADS: CPU reductions depend on it
        device=DEVICE.type,
        dtype="bfloat16",
        compile=DEVICE.type == "cuda",  # compiling on a CPU smoke run would only cost time
        deterministic=True,
    )


def _train(config: Path, out: Path) -> None:
    done = subprocess.run(
        attnlab_train_cmd(config, out), env=dict(os.environ), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert read_status(out)["status"] == "finished" and read_status(out)["deterministic"]


def test_two_identical_deterministic_runs_write_the_same_metrics(config, tmp_path):
    _train(config, tmp_path / "a")
    _train(config, tmp_path / "b")
    a, b = numbers(tmp_path / "a"), numbers(tmp_path / "b")
    assert len(a) == STEPS and "val_loss" in a[19]
    assert a == b


def test_sigkill_and_resume_equals_an_uninterrupted_run(config, tmp_path):
    kill_then_rerun(config, tmp_path / "killed", kill_after=20, max_steps=STEPS)
    _train(config, tmp_path / "ref")
    killed, ref = read_metrics(tmp_path / "killed"), read_metrics(tmp_path / "ref")
    assert [r["step"] for r in killed] == list(range(1, STEPS + 1))
    assert numbers(tmp_path / "killed") == numbers(tmp_path / "ref") and ref
