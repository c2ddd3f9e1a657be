"""Exact attention in query chunks, recomputed chunk by chunk in the backward pass.

For the wide-head calls of mixed virtual heads on CPU (query/key width G * d_h, values d_h, or the
reverse for ``on = "probs"``): torch's fused CPU kernel needs one head width, and zero-padding the
narrower side to the wider one doubles the work of every product on that side, while torch's
unfused math path would keep the whole [B, H, Tq, Tk] matrix for the backward pass. Here each chunk
of C query rows is computed by plain GEMMs at the true widths, ``softmax(q k^T * scale, masked)
v``; causal chunks stop at their last visible key. Only q, k, v are kept for the backward pass,
which recomputes each chunk's probabilities and accumulates dk, dv in place (the FlashAttention
recipe at chunk granularity), so at most one chunk's [B, H, C, Tk] scores exist at a time. C is
chosen so a chunk holds at most ``BUDGET`` scores: memory O(BUDGET) per call, independent of T at
a fixed number of tokens; a causal call takes at least ``CAUSAL_CHUNKS`` chunks, each stopping at
its last visible key. Cost: the forward GEMM q k^T once more in the backward pass, except when the
probabilities of all chunks together fit in ``BUDGET`` scores and there is no dropout: then they
are kept for the backward pass, as autograd keeps a single chunk's (memory still O(BUDGET)).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.parts import ScoreContext

#: scores per chunk (2^22 float32 = 16 MiB), and the fewest query rows a chunk takes
BUDGET = 2**22
MIN_ROWS = 16
#: a causal call runs in at least this many chunks, so most of the masked triangle is skipped
#: (5/8 of the products with 4 chunks; q k^T is computed again in the backward pass unless all
#: chunks' probabilities fit the budget)
CAUSAL_CHUNKS = 4

#: (first row, end row, keys read) per chunk; its mask is built when the chunk runs
Plan = list[tuple[int, int, int]]


def chunked_attention(
    q: Tensor, k: Tensor, v: Tensor, ctx: ScoreContext, scale: float, dropout: float = 0.0
) -> Tensor:
    """Attention [B, H, Tq, d_v] with ``scaled_dot_product_attention``'s semantics (top-left
    causal mask, ``ctx.allowed``, ``ctx.padding``) and at most ``BUDGET`` scores at a time."""
    B, H, Tq, _ = q.shape
    rows = max(MIN_ROWS, BUDGET // max(1, B * H * k.shape[2]))
    if ctx.allowed is None and ctx.is_causal:
        rows = min(rows, max(MIN_ROWS, -(-Tq // CAUSAL_CHUNKS)))
    plan = _plan(Tq, k.shape[2], rows, ctx)
    if len(plan) == 1:  # one chunk: autograd keeps its probabilities, within the budget
        c0, c1, end = plan[0]
        allowed = _allowed(ctx, c0, c1, end, q.device)
        p = _probs(q, k[:, :, :end], allowed, scale, dropout, _dropout_mask(dropout))
        return p @ v[:, :, :end]
    # all chunks' probabilities within the budget (and no dropout to replay): keep them
    keep = not dropout and B * H * sum((c1 - c0) * end for c0, c1, end in plan) <= BUDGET
    return _Chunked.apply(q, k, v, plan, ctx, scale, dropout, keep)


def _plan(Tq: int, Tk: int, rows: int, ctx: ScoreContext) -> Plan:
    """(first row, end row, keys read) of each chunk of ``rows`` query rows; a causal chunk
    (top-left aligned) reads only the keys up to its last row."""
    causal = ctx.allowed is None and ctx.is_causal
    return [
        (c0, min(Tq, c0 + rows), min(Tk, c0 + rows) if causal else Tk) for c0 in range(0, Tq, rows)
    ]


def _allowed(ctx: ScoreContext, c0: int, c1: int, end: int, device) -> Tensor | None:
    """The mask of query rows [c0, c1) over keys [0, end): [rows, keys], [B, 1, rows, keys] with
    padding, or None. Built per chunk when it runs (all chunks' masks together are Tq x Tk)."""
    allowed = None
    if ctx.allowed is not None:
        allowed = ctx.allowed[c0:c1, :end]
    elif ctx.is_causal:  # top-left aligned: key j <= query row i
        allowed = torch.ones(c1 - c0, end, dtype=torch.bool, device=device).tril(c0)
    if ctx.padding is not None:
        pad = ctx.padding[:, None, None, :end]
        allowed = pad if allowed is None else allowed & pad
    return allowed


def _dropout_mask(dropout: float):
    """A function p -> p's dropout multipliers (0 or 1 / (1 - dropout)), or None."""
    if not dropout:
        return None
    return lambda p: F.dropout(torch.ones_like(p), dropout)


def _probs(q: Tensor, k: Tensor, allowed, scale: float, dropout: float, mask_of) -> Tensor:
    s = q @ k.transpose(-1, -2)
    if scale != 1.0:
        s = s * scale
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(s, dim=-1)
    return p * mask_of(p) if mask_of is not None else p


class _Chunked(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        plan: Plan,
        sctx: ScoreContext,
        scale: float,
        dropout: float,
        keep: bool,
    ):
        ctx.rng = torch.get_rng_state() if dropout else None
        mask_of = _dropout_mask(dropout)
        out = q.new_empty(*q.shape[:-1], v.shape[-1])
        kept = []
        for c0, c1, end in plan:
            allowed = _allowed(sctx, c0, c1, end, q.device)
            p = _probs(q[:, :, c0:c1], k[:, :, :end], allowed, scale, dropout, mask_of)
            torch.matmul(p, v[:, :, :end], out=out[:, :, c0:c1])
            if keep:
                kept.append(p)
        ctx.save_for_backward(q, k, v, *kept)
        ctx.plan, ctx.sctx, ctx.scale, ctx.dropout = plan, sctx, scale, dropout
        return out

    @staticmethod
    def backward(ctx, g: Tensor):
        q, k, v, *kept = ctx.saved_tensors
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        with torch.random.fork_rng(devices=[], enabled=bool(ctx.dropout)):
            if ctx.dropout:  # the forward's dropout masks, drawn again in the same order
                torch.set_rng_state(ctx.rng)
            for i, (c0, c1, end) in enumerate(ctx.plan):
                qc, ke, ve, gc = q[:, :, c0:c1], k[:, :, :end], v[:, :, :end], g[:, :, c0:c1]
                if kept:
                    p = kept[i]
                else:
                    allowed = _allowed(ctx.sctx, c0, c1, end, q.device)
                    p = _probs(qc, ke, allowed, ctx.scale, 0.0, None)
                keep = _dropout_mask(ctx.dropout)(p) if ctx.dropout else None
                pd = p * keep if keep is not None else p
                dv[:, :, :end] += pd.transpose(-1, -2) @ gc
                dp = gc @ ve.transpose(-1, -2)
                if keep is not None:
                    dp = dp * keep
                ds = p * (dp - (dp * p).sum(-1, keepdim=True))
                if ctx.scale != 1.0:
                    ds = ds * ctx.scale
                dq[:, :, c0:c1] = ds @ ke
                dk[:, :, :end] += ds.transpose(-1, -2) @ qc
        return dq, dk, dv, None, None, None, None, None
