"""torchrun with two CPU processes (Gloo, pinned: any machine has CPUs for two ranks): the same
losses as one process with accumulation. NCCL on the GPUs present: test_gpu_distributed.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnlab.base.errors import UserError
from attnlab.config import load_config
from attnlab.runs.load import load_run_model
from attnlab.runs.rundir import read_status
from attnlab.train import train
from tests.helpers.distributed import assert_same_steps, tiny_training, torchrun_train

STEPS = 4


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> tuple[Path, Path]:
    """A prepared byte-level data dir and a config file training 4 steps on 2 x 4 sequences."""
    root = tmp_path_factory.mktemp("dist")
    return root, tiny_training(root, STEPS)


def _torchrun(cfg: Path, out: Path, *extra: str) -> None:
    torchrun_train(cfg, out, 2, *extra, timeout=240)


def _single(setup) -> Path:
    root, cfg = setup
    out = root / "single"
    if not (out / "status.json").exists():
        result = train(load_config(str(cfg), ["train.threads=1"]), out)
        assert read_status(out)["grad_accum"] == 2 and result.status == "finished"
    return out


def _compare(single: Path, dist: Path) -> None:
    assert_same_steps(single, dist, STEPS)
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
