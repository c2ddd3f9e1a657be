"""Which device and which arithmetic a run uses; the same rules for train, probe, eval and bench.

``device = "auto"`` means: CUDA when a GPU is visible (this process's ``LOCAL_RANK`` GPU under
``torchrun``), else Apple's MPS when it is usable and the job is a single process, else the CPU.
An explicit name (``cpu``, ``cuda``, ``cuda:1``, ``mps``) is checked against what is present.

``dtype`` (the compute precision of training):

- ``auto``: bfloat16 autocast on a CUDA device that supports it, float32 everywhere else;
- ``float32``: no autocast;
- ``bfloat16``: autocast to bfloat16 (CUDA, CPU, MPS); weights and optimizer stay float32;
- ``float16``: autocast to float16 with a ``torch.amp.GradScaler`` (dynamic loss scaling, so small
  gradients do not underflow); CUDA only.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch

from attnlab.base import devices
from attnlab.base.errors import UserError


def resolve_device(
    pref: str | torch.device | None = "auto",
    *,
    local_rank: int | None = None,
    setting: str = "device",
) -> torch.device:
    """The device ``pref`` names (see the module docstring); ``local_rank`` is set under torchrun.

    A device that is not present is a :class:`UserError` naming ``setting`` and what to use
    (:func:`attnlab.base.devices.check_device`).
    """
    if pref is None or str(pref) == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank or 0)
        if local_rank is None and devices.mps_usable():
            return torch.device("mps")
        return torch.device("cpu")
    devices.check_device(str(pref), setting)
    device = torch.device(pref)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank or 0)
    return device


def torchrun_local_rank() -> int | None:
    """This process's GPU index under ``torchrun`` (``LOCAL_RANK``); None in a single process."""
    value = os.environ.get("LOCAL_RANK", "")
    return int(value) if value.isdigit() else None


def device_name(pref: str | None = "auto", setting: str = "device") -> str:
    """:func:`resolve_device` as a name (``cuda:0``, ``mps``, ``cpu``), under ``torchrun`` this
    process's GPU: what the memory preflight estimates for, before anything is built."""
    return str(resolve_device(pref, local_rank=torchrun_local_rank(), setting=setting))


def auto_dtype(device: torch.device) -> torch.dtype:
    """``dtype = "auto"`` on ``device``: bfloat16 on a CUDA device that supports it, float32
    everywhere else (training's compute precision, and the probe's frozen base weights)."""
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


@dataclass
class Precision:
    """Autocast dtype (None = full float32) and the float16 loss scaler."""

    dtype: torch.dtype | None
    device_type: str
    scaler: torch.amp.GradScaler | None = None

    @property
    def name(self) -> str:
        return "float32" if self.dtype is None else str(self.dtype).removeprefix("torch.")

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype matmuls run in (for the peak FLOP/s measurement)."""
        return self.dtype or torch.float32

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)


def resolve_precision(pref: str, device: torch.device, setting: str = "train.dtype") -> Precision:
    """The :class:`Precision` for ``pref`` (auto/float32/bfloat16/float16) on ``device``."""
    cuda = device.type == "cuda"
    if pref == "auto":
        pref = "bfloat16" if auto_dtype(device) == torch.bfloat16 else "float32"
    if pref == "float32":
        return Precision(None, device.type)
    if pref == "float16":
        if not cuda:
            raise UserError(
                f"{setting}='float16' needs a CUDA device (loss scaling); use 'bfloat16' or 'auto'"
            )
        return Precision(torch.float16, "cuda", torch.amp.GradScaler("cuda"))
    if pref == "bfloat16":
        return Precision(torch.bfloat16, device.type)
    raise UserError(f"{setting}={pref!r}; choose auto, float32, bfloat16 or float16")
