"""Check a ``--device`` / ``train.device`` name before anything is placed on it."""

from __future__ import annotations

import os

from attnlab.base.errors import UserError

#: at most this many CPU threads per core (more only thrashes; tens of thousands crash the
#: OpenMP runtime)
THREADS_PER_CORE = 4


def check_device(name: str, flag: str = "--device") -> str:
    """``name`` if it is ``auto``, ``cpu``, ``mps`` (when usable) or a visible ``cuda[:N]``;
    otherwise a :class:`UserError` naming ``flag`` (``--device``, ``train.device``) and the devices
    this machine has. The one device-name check of attnlab (``runs.device.resolve_device`` calls
    it before it picks a device)."""
    import torch

    if name == "auto":
        return name
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError):
        raise UserError(
            f"{flag} {name!r} is not a device name; use auto, cpu, cuda[:N] or mps"
        ) from None
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise UserError(f"{flag} {name!r}: no CUDA device is visible; use auto or cpu")
        if dev.index is not None and dev.index >= n:
            raise UserError(
                f"{flag} {name!r}: this machine has {n} CUDA device(s), cuda:0..{n - 1}"
            )
    elif dev.type == "mps":
        if not mps_usable():
            raise UserError(f"{flag} {name!r}: MPS is not usable here; use auto or cpu")
    elif dev.type != "cpu":
        raise UserError(f"{flag} {name!r}: attnlab runs on cpu, cuda[:N] or mps")
    return name


def mps_usable() -> bool:
    """Apple's MPS backend is present and usable."""
    import torch

    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def check_threads(n: int | None, flag: str = "--threads") -> int | None:
    """``n`` CPU threads if at least 1 and at most :data:`THREADS_PER_CORE` per core."""
    if n is None:
        return None
    cores = os.cpu_count() or 1
    most = max(8, THREADS_PER_CORE * cores)
    if not 1 <= n <= most:
        raise UserError(
            f"{flag} {n} must be between 1 and {most} ({THREADS_PER_CORE} per core; this machine "
            f"has {cores} cores)"
        )
    return n
