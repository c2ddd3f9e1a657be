"""Achievable peak FLOP/s of one device, measured with a short square-matmul microbenchmark.

MFU (model FLOPs utilisation) divides the FLOPs a training step must do by the time it took and by
this peak. A datasheet peak is not known for every CPU or GPU, so the peak is *measured*: the best of
a few ``n x n @ n x n`` matmuls in the training dtype, each costing ``2 n^3`` FLOPs. The result is
the dense-matmul ceiling of this device as it is configured now (threads, clocks), which makes MFU a
statement about the model code, not about the datasheet. The measurement takes well under a second
and is cached per (device, dtype, threads) within a process.
"""

from __future__ import annotations

import time
from functools import lru_cache

import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


@lru_cache(maxsize=16)
def _measure(device_str: str, dtype: torch.dtype, n: int, iters: int, threads: int) -> float:
    device = torch.device(device_str)
    gen = torch.Generator(device=device).manual_seed(0)  # never touches the global RNG
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    for _ in range(2):
        a @ b
    _sync(device)
    best = float("inf")
    for _ in range(iters):
        t0 = time.perf_counter()
        a @ b
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / max(best, 1e-9)


def measure_peak_flops(
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    *,
    n: int | None = None,
    iters: int = 5,
) -> float:
    """Best observed dense-matmul FLOP/s on ``device`` in ``dtype`` (``2 n^3`` FLOPs per matmul).

    ``n`` defaults to 4096 on CUDA (enough to saturate tensor cores) and 512 on CPU (a few ms).
    """
    device = torch.device(device)
    if n is None:
        n = 4096 if device.type == "cuda" else 512
    return _measure(str(device), dtype, n, iters, torch.get_num_threads())


def mfu(
    flops_per_token_fwd: float, tokens_per_s: float, peak_flops: float, n_devices: int = 1
) -> float:
    """Model FLOPs utilisation of training: ``3 * F_fwd * tokens/s / (peak * devices)``.

    The backward pass costs about twice the forward (gradients w.r.t. activations and weights), hence
    the factor 3; for a dense transformer ``3 F_fwd`` is the familiar ``6N`` plus attention.
    """
    if peak_flops <= 0 or n_devices <= 0:
        return 0.0
    return 3.0 * flops_per_token_fwd * tokens_per_s / (peak_flops * n_devices)
