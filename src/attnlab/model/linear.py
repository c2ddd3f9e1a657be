"""The dense layer of every part: y = x W^T + b, with an optional row-major decoding layout.

Params in * out (+ out); FLOPs 2 * in * out per row. Same state dict as ``nn.Linear``.

Why a layout: batch-1 decoding multiplies one row by every weight of the model, so each new token
streams all the weights through the caches. On CPU, MKL reads ``x @ W_t`` with W_t = W^T stored
[in, out] contiguous about 1.4x faster than ``x @ W^T`` over nn.Linear's [out, in] storage when
the weights do not fit in L2 (measured for a d=256 model's 25 weights: 2.3 vs 3.3 ms per token,
benchmarks/FINDINGS.md §10). ``decode_layout(model)`` keeps W_t for every layer that supports it
while it is open, and drops it on exit: memory cost one extra copy of those weights, for that time.
A copy is rebuilt if its weight is changed in place meanwhile, so it is never stale.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class Linear(nn.Linear):
    """``nn.Linear`` that multiplies by a cached [in, out] copy of W inside ``decode_layout``."""

    _rows: tuple[int, Tensor] | None = None  # (weight._version, W^T contiguous)

    def set_decode_layout(self, on: bool) -> None:
        self._rows = None
        if on:
            self._rows = (self.weight._version, self.weight.detach().t().contiguous())

    def forward(self, x: Tensor) -> Tensor:
        rows = self._rows
        if rows is None or torch.is_grad_enabled():
            return F.linear(x, self.weight, self.bias)
        if rows[0] != self.weight._version:
            self.set_decode_layout(True)
            rows = self._rows
            assert rows is not None
        y = x @ rows[1]
        return y if self.bias is None else y + self.bias


@contextmanager
def decode_layout(model: nn.Module, enabled: bool = True) -> Iterator[None]:
    """Within the block, every part with ``set_decode_layout`` uses its [in, out] weight copies
    (autograd off only; with autograd on the plain path runs). ``enabled=False`` does nothing."""
    parts = [m for m in model.modules() if hasattr(m, "set_decode_layout")] if enabled else []
    for m in parts:
        m.set_decode_layout(True)
    try:
        yield
    finally:
        for m in parts:
            m.set_decode_layout(False)
