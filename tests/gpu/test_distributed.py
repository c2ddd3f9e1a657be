"""DDP over NCCL on the GPUs present: ``torchrun`` with 2 ranks on 2 GPUs gives the losses of one
process with 2 accumulated micro-batches (fp32, TF32 off through deterministic mode, so the only
difference is the order of one gradient sum). The 2-rank path on CPU (Gloo) is in
test_train_distributed.py and runs on every machine."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from attnlab.runs.rundir import read_metrics, read_status
from tests.helpers.data import prepare_bytes, run_config, word_corpus
from tests.helpers.runs import attnlab_train_cmd

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        torch.cuda.device_count() < 2,
        reason=f"a 2-rank NCCL job needs 2 GPUs; {torch.cuda.device_count()} visible",
    ),
]

STEPS = 6


def test_two_gpu_ranks_equal_one_gpu_with_accumulation(tmp_path):
    corpus = word_corpus(tmp_path / "c.jsonl", ["a", "b", "c", "d"], n_docs=60, length=50, seed=2)
    cfg = run_config(
        tmp_path / "cfg.toml",
        corpus,
        prepare_bytes(corpus, tmp_path / "data"),
        max_steps=STEPS,
        batch_size=4,
        tokens_per_step=256,
        warmup_steps=1,
        log_every=1,
        eval_every=3,
        checkpoint_every=3,
        eval_batches=2,
        device="cuda",
        dtype="float32",
        deterministic=True,
    )
    env = dict(os.environ)
    single = subprocess.run(attnlab_train_cmd(cfg, tmp_path / "one"), env=env, capture_output=True)
    assert single.returncode == 0, single.stderr
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += attnlab_train_cmd(cfg, tmp_path / "ddp")[1:]
    ddp = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert ddp.returncode == 0, ddp.stdout + ddp.stderr
    a, b = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "ddp")
    assert read_status(tmp_path / "ddp")["world_size"] == 2
    assert read_status(tmp_path / "one")["grad_accum"] == 2
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, STEPS + 1))
    for ra, rb in zip(a, b, strict=True):
        assert rb["loss"] == pytest.approx(ra["loss"], rel=1e-5)
        assert rb["grad_norm"] == pytest.approx(ra["grad_norm"], rel=1e-4)
