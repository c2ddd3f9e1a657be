"""The CPU decode kernel of int8 weight-only Linears: y = (x q^T) * s, reading each int8 once.

torchao 0.18's ``Int8Tensor`` weight-only linear runs ``torch.mm(x, q.t().to(x.dtype)) * s`` in
eager mode: each decoded token first writes a float copy of every int8 weight (1 byte read, 4
written, 4 read again), so int8 decoding is slower than float32 (benchmarks/results/
quant-gpt2-124m-cpu.md). torch's own CPU kernel for this product,
``aten._weight_int8pack_mm``, measured 3.7x slower per weight than float32's ``mm`` on this
project's CPU (AVX-512) for a one-row input. What does read each int8 once is inductor's fused
reduction of the same formula::

    y[r, o] = s[o] * sum_i x[r, i] * float(q[o, i])       (+ b[o])

compiled once (``torch.compile``, dynamic shapes: one kernel for every Linear of the model):
1 byte of weight per multiply-add against float32's 4, so a decode that streams its weights from
memory reads a quarter of the bytes. Same FLOPs as float32 (2 per weight per row).

It runs only inside ``decode_layout`` (``attnlab.model.generate`` on CPU), only for inputs of at
most ``ROWS_MAX`` rows (a decoded token per sequence; a prompt's prefill takes torchao's path) and
only for weights of at least ``MIN_WEIGHTS`` elements: the first call compiles (tens of seconds
on a busy 2-core machine), which only a large model's decoding repays. Numerics: the float32 sum
in another order than ``mm``'s, a few ulps (the battery's cached-decoding property holds it to the
scheme's ``verify_tolerance``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from attnlab.model.linear import DecodeKernel, register_decode_kernel

#: the fused kernel serves inputs of at most this many rows (batch x new positions)
ROWS_MAX = 4
#: weights smaller than this keep torchao's path (the compile is not repaid)
MIN_WEIGHTS = 1 << 18

_compiled: Callable[[Tensor, Tensor, Tensor], Tensor] | None = None


def int8_rows_matmul(x: Tensor, qdata: Tensor, scale: Tensor) -> Tensor:
    """x [rows, in] times int8 ``qdata`` [out, in] with per-row ``scale`` [out]: the formula of
    the module docstring, written as a broadcast so inductor fuses it into one reduction."""
    return (x[:, None, :] * qdata[None].to(x.dtype)).sum(-1) * scale.to(x.dtype)


def _kernel() -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    global _compiled
    if _compiled is None:
        _compiled = torch.compile(int8_rows_matmul, dynamic=True, fullgraph=True)
    return _compiled


def _int8_weight_only(weight: Tensor) -> tuple[Tensor, Tensor] | None:
    """(qdata [out, in] int8, scale [out]) of a torchao per-row int8 weight-only tensor."""
    qdata = getattr(weight, "qdata", None)
    scale = getattr(weight, "scale", None)
    if qdata is None or scale is None or qdata.dtype != torch.int8 or qdata.dim() != 2:
        return None
    if getattr(weight, "act_quant_kwargs", None) is not None:  # int8-dynamic: its own kernel
        return None
    if getattr(weight, "act_pre_scale", None) is not None or scale.numel() != qdata.shape[0]:
        return None
    block = getattr(weight, "block_size", None)
    if not block or block[-1] != qdata.shape[-1]:  # per-group: torchao dequantizes it whole
        return None
    # zero_point: symmetric int8 stores zeros, which torchao's own per-row product ignores too
    return qdata, scale.reshape(-1)


def int8_decode_kernel(weight: Tensor) -> DecodeKernel | None:
    """The decode kernel for ``weight`` when it is a large int8 weight-only tensor on CPU."""
    parts = _int8_weight_only(weight)
    if parts is None or weight.device.type != "cpu" or weight.numel() < MIN_WEIGHTS:
        return None
    qdata, scale = parts

    def run(x: Tensor, bias: Tensor | None) -> Tensor | None:
        rows = x.numel() // x.shape[-1]
        if rows > ROWS_MAX or x.dtype != scale.dtype:
            return None
        y = _kernel()(x.reshape(rows, x.shape[-1]), qdata, scale)
        y = y.reshape(*x.shape[:-1], qdata.shape[0])
        return y if bias is None else y + bias

    return run


register_decode_kernel(int8_decode_kernel)
