"""Shared by the ``gpu``-marked tests (test_gpu_*.py): the device they run on and exact fp32."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

from attnlab.runs import determinism

#: CUDA when present; the CPU only in a smoke run of the test code (ATTNLAB_GPU_TESTS_ON_CPU=1)
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

needs_cuda = pytest.mark.skipif(
    DEVICE.type != "cuda", reason="CUDA itself is under test (its kernels, memory or NCCL)"
)


@contextlib.contextmanager
def exact_fp32() -> Iterator[None]:
    """fp32 matmuls in fp32 (TF32 off), so an fp32 comparison is not a TF32 one; restored after."""
    before = determinism.current()
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        determinism.restore(before)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b||, in float64: one number per tensor, robust to a few rounded entries."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))
