"""The dense layer of every part: y = x W^T + b, with an optional layout for decoding.

Params in * out (+ out); FLOPs 2 * in * out per row. Same state dict as ``nn.Linear``.

Why a layout: batch-1 decoding multiplies one row by every weight of the model, so each new token
streams all the weights through the caches, and on CPU one core's stream is the limit: MKL runs a
one-row product on a single thread. ``decode_layout(model)`` keeps, for every layer that supports
it, W^T split by output columns into n = torch.get_num_threads() contiguous blocks
[n, in, out / n], and multiplies a few rows by all blocks in one batched matmul, one block per
thread. Measured on this project's 2-core CPU machine for a d=256, 6-layer model's 25 weights (23 MB):
2.8 ms per token with nn.Linear's [out, in] weights, 2.0 ms with W^T [in, out], 1.3-1.8 ms
split in two (benchmarks/FINDINGS.md §10). Inputs of more than ``ROWS_MAX`` rows (prefill of
long prompts, recomputation, training) take the plain path. Memory cost: one extra copy of the
weights while the layout is open; it is dropped on exit, and rebuilt if its weight is changed in
place meanwhile, so it is never stale.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: at most this many rows (batch x new positions) use the decoding layout
ROWS_MAX = 32


def param_key(params: tuple[Tensor, ...]) -> tuple:
    """What identifies the values of ``params``: storage, in-place version and dtype (a derived
    copy keyed by it is stale once the key changes: an update, a move or a cast)."""
    return tuple((p.data_ptr(), p._version, p.dtype) for p in params)


def split_columns(weight: Tensor) -> Tensor:
    """W [out, in] -> W^T split by output columns into [n, in, out / n] contiguous blocks
    (n = torch.get_num_threads() when it divides out, else 1)."""
    out, d_in = weight.shape
    n = torch.get_num_threads()
    n = n if n > 1 and out % n == 0 else 1
    return weight.detach().t().reshape(d_in, n, out // n).permute(1, 0, 2).contiguous()


def uses_layout(x: Tensor) -> bool:
    """Few rows, autograd off, not under torch.compile (which chooses its own layout)."""
    return (
        x.numel() <= ROWS_MAX * x.shape[-1]
        and not torch.is_grad_enabled()
        and not torch.compiler.is_compiling()
    )


def matmul_split(x: Tensor, blocks: Tensor, bias: Tensor | None) -> Tensor:
    """x [..., in] @ W^T (+ b) with W^T given as ``split_columns`` blocks [n, in, out / n]."""
    n, d_in, part = blocks.shape
    rows = x.reshape(1, -1, d_in).expand(n, -1, d_in)
    y = torch.bmm(rows, blocks).transpose(0, 1).reshape(*x.shape[:-1], n * part)
    return y if bias is None else y + bias


#: a decode kernel: y = x W^T + b for a few rows, or None when it declines these rows
DecodeKernel = Callable[[Tensor, Tensor | None], Tensor | None]
#: weight -> its decode kernel, or None; registered by packages that own a weight kind (a
#: quantized weight's fast few-row product: attnlab.quant.decode_kernel)
DECODE_KERNELS: list[Callable[[Tensor], DecodeKernel | None]] = []


def register_decode_kernel(provider: Callable[[Tensor], DecodeKernel | None]) -> None:
    """Add ``provider`` (idempotent): ``decode_layout`` asks it for each non-float weight."""
    if provider not in DECODE_KERNELS:
        DECODE_KERNELS.append(provider)


def decode_kernel(weight: Tensor) -> DecodeKernel | None:
    """The first registered kernel that takes ``weight`` (None: its own ``F.linear``)."""
    for provider in DECODE_KERNELS:
        kernel = provider(weight)
        if kernel is not None:
            return kernel
    return None


class DecodeLayout:
    """A module that keeps split weight copies while ``decode_layout`` is open."""

    def set_decode_layout(self, on: bool) -> None:
        raise NotImplementedError


class Linear(DecodeLayout, nn.Linear):
    """``nn.Linear`` that multiplies a few rows by split W^T blocks inside ``decode_layout``."""

    _blocks: tuple[tuple, Tensor] | None = None  # (param_key of W, split_columns(W))
    _kernel: DecodeKernel | None = None  # a quantized weight's registered decode kernel

    def set_decode_layout(self, on: bool) -> None:
        w = self.weight
        # a quantized weight (a tensor subclass) keeps its own low-precision form: a registered
        # decode kernel, if one takes it, multiplies its few rows
        plain = type(w.data) is Tensor
        self._blocks = (param_key((w,)), split_columns(w)) if on and plain else None
        self._kernel = decode_kernel(w) if on and not plain else None

    def forward(self, x: Tensor) -> Tensor:
        if self._kernel is not None and uses_layout(x):
            y = self._kernel(x, self.bias)
            if y is not None:
                return y
        blocks = self._blocks
        if blocks is None or not uses_layout(x):
            return F.linear(x, self.weight, self.bias)
        if blocks[0] != param_key((self.weight,)):
            self.set_decode_layout(True)
            blocks = self._blocks
            assert blocks is not None
        return matmul_split(x, blocks[1], self.bias)


@contextmanager
def decode_layout(model: nn.Module, enabled: bool = True) -> Iterator[None]:
    """Within the block, every :class:`DecodeLayout` module multiplies few-row inputs by its
    split weight copies (autograd off only). ``enabled=False`` does nothing."""
    parts = [m for m in model.modules() if isinstance(m, DecodeLayout)] if enabled else []
    for m in parts:
        m.set_decode_layout(True)
    try:
        yield
    finally:
        for m in parts:
            m.set_decode_layout(False)
