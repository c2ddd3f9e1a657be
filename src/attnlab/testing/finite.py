"""Comparing outputs when a part may compute NaN: every comparison of the battery treats a NaN
(or an infinity) as a difference, never as agreement, and a non-finite output of a finite input
is a failure of its own, with its own message (``max |a - b|`` over a tensor holding NaN is NaN,
and ``NaN > limit`` is False: a check written that way passes whatever the part reads)."""

from __future__ import annotations

import math

import torch

from attnlab.testing.result import Result, failed


def difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b|; infinite when the shapes differ or either holds a NaN or an infinity."""
    if a.shape != b.shape:
        return math.inf
    if a.numel() == 0:
        return 0.0
    if not (bool(torch.isfinite(a).all()) and bool(torch.isfinite(b).all())):
        return math.inf
    return float((a - b).abs().max())


def nonfinite(prop: str, name: str, out: torch.Tensor, where: str) -> Result | None:
    """A failure of ``prop`` when ``out`` (logits [B, T, V] of finite inputs) holds NaN or
    infinities, naming how many and the first position; None when every value is finite."""
    bad = ~torch.isfinite(out)
    n = int(bad.sum())
    if not n:
        return None
    at = ""
    if out.dim() >= 2:
        first = bad.nonzero()[0]
        at = f"; the first at position {int(first[1])}"
    return failed(
        prop,
        f"the float64 forward of {name}'s small model gives {n} non-finite outputs of "
        f"{out.numel()} (NaN or infinity{at}): what the part computes cannot be compared",
        "keep every output finite for finite inputs (no division by zero, no log of 0, no NaN "
        "written into a tensor as a mask: use the dtype's minimum, or torch.where)",
        float(n),
        0.0,
        where,
    )
