"""Deterministic mode (attnlab.runs.determinism, ``train.deterministic``) on CPU: what it sets, that it
restores everything, that every variant runs under it, and that two runs give the same bits.
The GPU versions (two CUDA runs, SIGKILL + resume on CUDA) are in test_gpu_determinism.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnlab.base.errors import UserError
from attnlab.bench.variants import VARIANTS, variant_config
from attnlab.config import load_config
from attnlab.model import build_model
from attnlab.runs import determinism
from attnlab.runs.rundir import read_status
from attnlab.train import train
from tests.helpers.data import tiny_run_config
from tests.helpers.runs import numbers


def test_settings_are_applied_inside_and_restored_after():
    torch.set_float32_matmul_precision("high")  # a non-default state to come back to
    try:
        before = determinism.current()
        with determinism.deterministic_mode(True, "cpu"):
            now = determinism.current()
            assert now.algorithms and not now.warn_only
            assert now.cudnn_deterministic and not now.cudnn_benchmark
            assert now.matmul_precision == "highest" and not now.cudnn_tf32
            assert now.sdp[3] is False  # cuDNN SDPA off; flash / efficient / math as they were
            assert now.sdp[:3] == before.sdp[:3]
        assert determinism.current() == before
        with determinism.deterministic_mode(False, "cpu"):
            assert determinism.current() == before  # off: nothing touched
    finally:
        torch.set_float32_matmul_precision("highest")


def test_settings_are_restored_when_the_block_raises():
    before = determinism.current()
    with pytest.raises(KeyError), determinism.deterministic_mode(True, "cpu"):
        raise KeyError("x")
    assert determinism.current() == before


def test_cublas_workspace_config_is_set_when_unset_and_a_wrong_one_is_refused(monkeypatch):
    monkeypatch.delenv(determinism.CUBLAS_ENV, raising=False)
    determinism._set_cublas_env()
    assert determinism.current().cublas_env == ":4096:8"
    monkeypatch.setenv(determinism.CUBLAS_ENV, ":16:8")
    determinism._set_cublas_env()  # the other deterministic value is kept
    assert determinism.current().cublas_env == ":16:8"
    monkeypatch.setenv(determinism.CUBLAS_ENV, ":4096:2:16:8")
    with pytest.raises(UserError, match=r"CUBLAS_WORKSPACE_CONFIG.*':4096:2:16:8'.*:4096:8"):
        determinism._set_cublas_env()


@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_variant_trains_a_step_in_deterministic_mode(name):
    """No op of any variant lacks a deterministic kernel (strict mode would raise here)."""
    base = load_config("tiny", ["model.d_model=32", "model.n_layers=2", "data.seq_len=16"])
    torch.manual_seed(0)
    model = build_model(variant_config(base, name).model)
    ids = torch.randint(0, model.cfg.vocab_size, (2, 16))
    with determinism.deterministic_mode(True, "cpu"):
        out = model(ids, ids, return_logits=False)
        (out.loss + (out.aux_loss if out.aux_loss is not None else 0)).backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def _cfg(data_dir: Path, *extra: str):
    return tiny_run_config(
        data_dir, "train.deterministic=true", "model.dropout=0.1", *extra, steps=6, eval_every=3
    )


@pytest.mark.fast
def test_two_identical_deterministic_runs_give_the_same_bits(data_dir, tmp_path):
    before = determinism.current()
    a = train(_cfg(data_dir), tmp_path / "a")
    assert determinism.current() == before  # train() leaves the process as it found it
    b = train(_cfg(data_dir), tmp_path / "b")
    assert a.status == b.status == "finished"
    assert numbers(tmp_path / "a") == numbers(tmp_path / "b")
    assert len(numbers(tmp_path / "a")) == 6 and "val_loss" in numbers(tmp_path / "a")[2]
    assert read_status(tmp_path / "a")["deterministic"] is True


def test_a_cublas_call_made_before_the_mode_becomes_a_user_error(monkeypatch):
    """What torch raises when the process's first cuBLAS call came before the workspace config
    is turned into a message with the fix (the real case needs a GPU: test_gpu_determinism)."""

    class Probe:
        def __matmul__(self, other):
            raise RuntimeError(
                "Deterministic behavior was enabled ... set an environment variable before "
                "running your PyTorch application: CUBLAS_WORKSPACE_CONFIG=:4096:8 or :16:8"
            )

    monkeypatch.setattr(determinism.torch, "ones", lambda *a, **k: Probe())
    with pytest.raises(UserError, match=r"export CUBLAS_WORKSPACE_CONFIG=:4096:8 before starting"):
        determinism._probe_cublas(torch.device("cpu"))
