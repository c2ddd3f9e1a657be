"""Reading the parts' statistics out of a whole model, for the run loop and ``attnlab inspect``.

:func:`train_stats` gathers every part's :meth:`~attnlab.parts.Part.train_stats` into flat
``metrics.jsonl`` columns: ``part/KEY/LAYER`` per layer (LAYER counts the parts declaring KEY in
module order, i.e. the layer for a part present once per block) and ``part/KEY``, their mean over
layers. The 0-d tensors are stacked and read with one ``tolist()`` (one device sync per log step).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from attnlab.parts.part import Part

PREFIX = "part/"


def parts_of(module: nn.Module) -> Iterator[Part]:
    """Every part inside ``module``, in module order."""
    for m in module.modules():
        if isinstance(m, Part):
            yield m


@torch.no_grad()
def train_stats(module: nn.Module) -> dict[str, float]:
    """``{"part/KEY/LAYER": value, "part/KEY": mean over layers}`` of every part's
    ``train_stats()`` (non-finite values are left out; {} when no part declares any)."""
    keys: list[str] = []
    values: list[Tensor | float] = []
    for part in parts_of(module):
        for key, value in part.train_stats().items():
            keys.append(key)
            values.append(value)
    if not keys:
        return {}
    tensors = [v for v in values if isinstance(v, Tensor)]
    read = iter([])
    if tensors:  # one copy to the host (a model's statistics live on one device)
        device = tensors[0].device
        stacked = torch.stack([t.detach().float().reshape(()).to(device) for t in tensors])
        read = iter(stacked.cpu().tolist())
    numbers = [next(read) if isinstance(v, Tensor) else float(v) for v in values]
    per_key: dict[str, list[float]] = {}
    for key, x in zip(keys, numbers, strict=True):
        per_key.setdefault(key, []).append(x)
    out: dict[str, float] = {}
    for key, xs in per_key.items():
        for layer, x in enumerate(xs):
            if math.isfinite(x):
                out[f"{PREFIX}{key}/{layer}"] = x
        finite = [x for x in xs if math.isfinite(x)]
        if finite:
            out[f"{PREFIX}{key}"] = sum(finite) / len(finite)
    return out
