"""torchrun with two CPU processes (Gloo, pinned: any machine has CPUs for two ranks): the same
losses as one process with accumulation. NCCL on the GPUs present: test_gpu_distributed.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab.base.errors import UserError
from attnlab.config import load_config
from attnlab.runs.load import load_run_model
from attnlab.runs.rundir import read_metrics, read_status
from attnlab.train import train
from tests.helpers.data import prepare_bytes, run_config, word_corpus

STEPS = 4


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> tuple[Path, Path]:
    """A prepared byte-level data dir and a config file training 4 steps on 2 x 4 sequences."""
    root = tmp_path_factory.mktemp("dist")
    words = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
    corpus = word_corpus(root / "c.jsonl", words, n_docs=60, length=50, seed=2)
    cfg = run_config(
        root / "cfg.toml",
        corpus,
        prepare_bytes(corpus, root / "data"),
        max_steps=STEPS,
        batch_size=4,
        tokens_per_step=256,
        warmup_steps=1,
        log_every=1,
        eval_every=2,
        checkpoint_every=2,
        eval_batches=2,
    )
    return root, cfg


def _torchrun(cfg: Path, out: Path, *extra: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += ["-m", "attnlab", "train", str(cfg), "--out", str(out), "--quiet", *extra]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _single(setup) -> Path:
    root, cfg = setup
    out = root / "single"
    if not (out / "status.json").exists():
        result = train(load_config(str(cfg), ["train.threads=1"]), out)
        assert read_status(out)["grad_accum"] == 2 and result.status == "finished"
    return out


def _compare(single: Path, dist: Path) -> None:
    a, b = read_metrics(single), read_metrics(dist)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, STEPS + 1))
    for ra, rb in zip(a, b):
        assert rb["loss"] == pytest.approx(ra["loss"], rel=1e-5, abs=1e-6)
        assert rb["grad_norm"] == pytest.approx(ra["grad_norm"], rel=1e-4)
        assert ("val_loss" in ra) == ("val_loss" in rb)
        if "val_loss" in ra:
            assert rb["val_loss"] == pytest.approx(ra["val_loss"], rel=1e-5)
    sa, sb = read_status(single), read_status(dist)
    assert sb["world_size"] == 2 and sb["grad_accum"] == 1
    assert sa["schedule_hash"] == sb["schedule_hash"] and sa["tokens"] == sb["tokens"]


@pytest.mark.parametrize("parallel", ["ddp", pytest.param("fsdp", marks=pytest.mark.slow)])
def test_two_ranks_equal_one_process_with_accumulation(setup, parallel):
    root, cfg = setup
    out = root / parallel
    _torchrun(cfg, out, "--set", f"train.parallel={parallel}")
    _compare(_single(setup), out)
    model, _, _ = load_run_model(out)  # rank 0 wrote full, unsharded weights
    ref, _, _ = load_run_model(_single(setup))
    for (name, p), q in zip(ref.state_dict().items(), model.state_dict().values()):
        assert p.shape == q.shape and float((p - q).abs().max()) < 1e-4, name


def test_more_ranks_than_gpus_is_a_user_error_not_an_invalid_ordinal(monkeypatch):
    """2 ranks on a 1-GPU node with device auto: refused before NCCL, naming both fixes."""
    import torch

    from attnlab.runs.distributed import setup

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(UserError, match=r"2 processes .* only 1 GPU.*nproc_per_node=1.*cpu"):
        setup("auto")
