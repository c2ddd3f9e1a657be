"""Deterministic mode (``train.deterministic``): the same run twice gives the same bits.

What :func:`deterministic_mode` sets while it is entered, and restores on exit:

- ``torch.use_deterministic_algorithms(True)`` (strict: an op with no deterministic kernel raises
  instead of warning). In torch >= 2.2 this also makes SDPA's backward deterministic: the flash
  backward runs FlashAttention-2's deterministic variant and the memory-efficient backward runs
  with ``num_splits_key = 1`` (no atomics); torch's SDPA selector already refuses the cuDNN
  backend in strict mode. The math backend is deterministic whenever its matmuls are. Inductor
  turns off its numerics-changing autotuning and benchmarking in this mode;
- the cuDNN SDPA backend off explicitly (belt and braces), flash, memory-efficient and math as
  they were;
- ``cudnn.deterministic = True``, ``cudnn.benchmark = False``;
- TF32 off for cuBLAS matmuls and cuDNN (fp32 math in fp32, so results do not depend on which
  kernel the library picks for a shape);
- ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` in the environment when it is unset. torch caches the
  cuBLAS workspace size and the "is this config deterministic" check at the *first cuBLAS call
  of the process*, so it must be in place before any matmul on the GPU. ``attnlab train`` sets
  it before touching the GPU; in a process that already ran a cuBLAS call without it, the probe
  matmul fails and a :class:`~attnlab.base.errors.UserError` says to export it before starting.

On CPU the same torch flags are set. CPU kernels are already deterministic at a fixed thread count,
so the mode is not needed there and is harmless: a few ops (index_put / embedding backward) switch
to their sorted deterministic variants and ``torch.empty`` fills new memory with NaN; a tiny-preset
step took about 10% longer with it on this project's busy 2-core machine (a rough figure).

Cost on CUDA (not measured on this project's machines yet; ``benchmarks/gpu_h100.sh`` measures it):
the deterministic flash / memory-efficient backward give up split-K parallelism over keys, the
smaller cuBLAS workspace limits split-K matmul kernels, fp32 matmuls run without TF32 (bf16
autocast matmuls are unaffected), and compiled graphs skip autotuning. Determinism holds for the
same machine, software, world size and CPU thread count (``train.threads``: CPU reductions split
by thread); it is not a promise across GPUs or torch versions.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from attnlab.base.errors import UserError

CUBLAS_ENV = "CUBLAS_WORKSPACE_CONFIG"
#: the two workspace configs torch accepts as deterministic (``Context::checkCuBLASConfig...``)
CUBLAS_DETERMINISTIC = (":4096:8", ":16:8")


@dataclass(frozen=True)
class Settings:
    """The global switches deterministic mode touches, as read from torch and the environment.

    TF32 is read, set and restored through one family of torch's switches only
    (``set_float32_matmul_precision`` and ``cudnn.allow_tf32``): mixing them with the per-backend
    ``fp32_precision`` strings makes torch refuse later reads of either.
    """

    algorithms: bool
    warn_only: bool
    cudnn_deterministic: bool
    cudnn_benchmark: bool
    matmul_precision: str  # "highest" = no TF32 in cuBLAS (nor bf16 passes on CPU)
    cudnn_tf32: bool
    sdp: tuple[bool, bool, bool, bool]  # flash, memory-efficient, math, cuDNN
    cublas_env: str | None


def current() -> Settings:
    """The switches as they are now."""
    b = torch.backends
    return Settings(
        algorithms=torch.are_deterministic_algorithms_enabled(),
        warn_only=torch.is_deterministic_algorithms_warn_only_enabled(),
        cudnn_deterministic=b.cudnn.deterministic,
        cudnn_benchmark=b.cudnn.benchmark,
        matmul_precision=torch.get_float32_matmul_precision(),
        cudnn_tf32=b.cudnn.allow_tf32,
        sdp=(
            b.cuda.flash_sdp_enabled(),
            b.cuda.mem_efficient_sdp_enabled(),
            b.cuda.math_sdp_enabled(),
            b.cuda.cudnn_sdp_enabled(),
        ),
        cublas_env=os.environ.get(CUBLAS_ENV),
    )


def restore(s: Settings) -> None:
    """Put every switch back as ``s`` recorded it."""
    b = torch.backends
    torch.use_deterministic_algorithms(s.algorithms, warn_only=s.warn_only)
    b.cudnn.deterministic, b.cudnn.benchmark = s.cudnn_deterministic, s.cudnn_benchmark
    torch.set_float32_matmul_precision(s.matmul_precision)
    b.cudnn.allow_tf32 = s.cudnn_tf32
    flash, efficient, math, cudnn = s.sdp
    b.cuda.enable_flash_sdp(flash)
    b.cuda.enable_mem_efficient_sdp(efficient)
    b.cuda.enable_math_sdp(math)
    b.cuda.enable_cudnn_sdp(cudnn)
    if s.cublas_env is None:
        os.environ.pop(CUBLAS_ENV, None)
    else:
        os.environ[CUBLAS_ENV] = s.cublas_env


def _set_cublas_env() -> None:
    value = os.environ.get(CUBLAS_ENV)
    if value is None:
        os.environ[CUBLAS_ENV] = CUBLAS_DETERMINISTIC[0]
    elif value not in CUBLAS_DETERMINISTIC:
        raise UserError(
            f"train.deterministic needs {CUBLAS_ENV} to be {' or '.join(CUBLAS_DETERMINISTIC)}, "
            f"but the environment sets it to {value!r}; unset it or export "
            f"{CUBLAS_ENV}={CUBLAS_DETERMINISTIC[0]}"
        )


def _probe_cublas(device: torch.device) -> None:
    """One tiny matmul: torch raises here if cuBLAS was first used without the workspace config."""
    a = torch.ones(8, 8, device=device)
    try:
        (a @ a).sum().item()
    except RuntimeError as e:
        if CUBLAS_ENV not in str(e):
            raise
        raise UserError(
            f"train.deterministic on CUDA needs {CUBLAS_ENV}={CUBLAS_DETERMINISTIC[0]} before the "
            "process's first cuBLAS call, and this process already made one without it; export "
            f"{CUBLAS_ENV}={CUBLAS_DETERMINISTIC[0]} before starting Python"
        ) from None


def apply(device: torch.device) -> None:
    """Switch deterministic mode on (see the module docstring for what it sets)."""
    b = torch.backends
    if device.type == "cuda":
        _set_cublas_env()
    torch.use_deterministic_algorithms(True, warn_only=False)
    b.cudnn.deterministic, b.cudnn.benchmark = True, False
    torch.set_float32_matmul_precision("highest")
    b.cudnn.allow_tf32 = False
    b.cuda.enable_cudnn_sdp(False)
    if device.type == "cuda":
        _probe_cublas(device)


@contextlib.contextmanager
def deterministic_mode(enabled: bool, device: torch.device | str) -> Iterator[None]:
    """Deterministic mode inside the block when ``enabled`` (else nothing); every switch is
    restored on exit, so one process can run deterministic and ordinary runs one after another."""
    if not enabled:
        yield
        return
    before = current()
    try:
        apply(torch.device(device))
        yield
    finally:
        restore(before)
