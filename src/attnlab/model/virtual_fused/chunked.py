"""Exact attention in query chunks, each chunk recomputed in the backward pass.

For the wide-head calls of mixed virtual heads on CPU (query/key width G * d_h, values d_h):
torch's fused CPU kernel needs one head width, and zero-padding the values to the query width
doubles the work of every P V product, while its unfused math path would keep the whole
[B, H, Tq, Tk] matrix for the backward pass. Here each chunk of C query rows is computed by
plain GEMMs at the true widths (``softmax(q k^T * scale, masked) v``) under
``torch.utils.checkpoint``: only one chunk's [B, H, C, Tk] scores exist at a time, and causal
chunks stop at their last visible key. C is chosen so a chunk holds at most ``BUDGET`` scores:
memory O(BUDGET) per call, independent of T at a fixed number of tokens. Cost: with more than
one chunk, each chunk's forward runs twice (once more in the backward pass).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from attnlab.parts import ScoreContext

#: scores per chunk (2^22 float32 = 16 MiB), and the fewest query rows a chunk takes
BUDGET = 2**22
MIN_ROWS = 16


def chunked_attention(
    q: Tensor, k: Tensor, v: Tensor, ctx: ScoreContext, scale: float, dropout: float = 0.0
) -> Tensor:
    """Attention [B, H, Tq, d_v] with ``scaled_dot_product_attention``'s semantics (top-left
    causal mask, ``ctx.allowed``, ``ctx.padding``) and at most ``BUDGET`` scores at a time."""
    B, H, Tq, _ = q.shape
    Tk = k.shape[2]
    rows = max(MIN_ROWS, BUDGET // max(1, B * H * Tk))
    outs = []
    for c0 in range(0, Tq, rows):
        c1 = min(Tq, c0 + rows)
        end, allowed = Tk, None
        if ctx.allowed is not None:
            allowed = ctx.allowed[c0:c1]
        elif ctx.is_causal:  # top-left aligned: key j <= query row i
            end = min(Tk, c1)
            allowed = torch.ones(c1 - c0, end, dtype=torch.bool, device=q.device).tril(c0)
        if ctx.padding is not None:
            pad = ctx.padding[:, None, None, :end]
            allowed = pad if allowed is None else allowed & pad
        args = (q[:, :, c0:c1], k[:, :, :end], v[:, :, :end], allowed, scale, dropout)
        if rows >= Tq:
            return _math(*args)
        outs.append(checkpoint(_math, *args, use_reentrant=False))
    return torch.cat(outs, dim=2)


def _math(
    q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, scale: float, dropout: float
) -> Tensor:
    s = q @ k.transpose(-1, -2)
    if scale != 1.0:
        s = s * scale
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(s, dim=-1)
    if dropout:
        p = F.dropout(p, dropout)
    return p @ v
