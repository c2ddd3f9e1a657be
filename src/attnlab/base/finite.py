"""Refuse numbers that are not numbers: a model whose weights, or whose results, hold NaN or inf.

A diverged run's checkpoint (or a damaged one) scores as blank cells and decodes as NUL bytes;
these checks say so instead, with :class:`~attnlab.base.errors.NonFiniteError` (exit code 3).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from attnlab.base.errors import NonFiniteError


def plain_tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Every parameter and buffer as plain tensors: a quantized weight (a tensor subclass such as
    torchao's, which implements no elementwise ops) by the tensors it holds (data, scales); a
    weight split over a mesh (a DTensor: tensor parallelism, FSDP2) by this rank's shard."""
    out = []
    for name, t in (*model.named_parameters(), *model.named_buffers()):
        to_local = getattr(t, "to_local", None)
        if callable(to_local):
            out.append((name, to_local()))
            continue
        flatten = getattr(t, "__tensor_flatten__", None)
        if type(t.data) is torch.Tensor or flatten is None:
            out.append((name, t))
            continue
        for inner in flatten()[0]:
            out.append((f"{name}.{inner}", getattr(t, inner)))
    return out


def check_weights(model: nn.Module, source: str) -> None:
    """Raise when any parameter or buffer of ``model`` holds NaN or inf, naming the first few."""
    bad: list[str] = []
    total = 0
    with torch.no_grad():
        for name, t in plain_tensors(model):
            if not t.is_floating_point() or t.device.type == "meta":
                continue
            n = int((~torch.isfinite(t)).sum())
            if n:
                total += n
                bad.append(f"{name} ({n:,} of {t.numel():,})")
    if bad:
        shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise NonFiniteError(
            f"{source} has {total:,} NaN/inf weights: {shown}. The run probably diverged (see its "
            "status.json); evaluate an earlier checkpoint (RUN_DIR/checkpoints/step_N) or retrain "
            "with a lower train.lr"
        )


def non_finite_metrics(results: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """``task.metric`` of every NaN/inf value in ``{task: {"metrics": {...}}}``."""
    out = []
    for task, entry in results.items():
        for name, value in (entry.get("metrics") or {}).items():
            if isinstance(value, float) and not math.isfinite(value):
                out.append(f"{task}.{name}")
    return out


def check_metrics(results: Mapping[str, Mapping[str, Any]], source: str) -> None:
    """Raise when a task's score is NaN/inf (a model whose outputs are not finite)."""
    bad = non_finite_metrics(results)
    if bad:
        raise NonFiniteError(
            f"{source} produced non-finite scores ({', '.join(bad[:6])}): its outputs hold NaN or "
            "inf. Evaluate an earlier checkpoint or retrain with a lower train.lr"
        )
