"""Causal attention with a folded bias (ALiBi's columns) past the length one call may fold:
fused SDPA per group of query rows, each group's columns centred on its own middle row.

A separable bias folds into extra q/k columns ``[m_h] . [j - c]`` (``folds.py``); in float32 a
logit then carries about m |i - c| 2^-24 of rounding, so one call centred on c = T / 2 stays
within ``fold_tolerance`` only up to T ~ 1,300 (m = 1/2). Here the rows are cut into groups of
G rows (the largest G = 128 2^k the tolerance allows at the group's own centre), and group g
(rows [a, e)) runs on its own columns over the keys it may see, as two flash calls merged by
their log-sum-exps::

    diag: (o_d, lse_d) = SDPA(q[a:e], k[a:e], v[a:e], is_causal)      columns centred on g
    far:  (o_f, lse_f) = SDPA(q[a:e], k[:a], v[:a])                    (no mask: all earlier)
    lse = logaddexp(lse_d, lse_f),  out = o_d exp(lse_d - lse) + o_f exp(lse_f - lse)

Backward recomputes each group's widened q, k, v and hands both flash backwards the merged out
and lse (each then computes its share of the exact dq, dk, dv). Work: causal SDPA's at the
widened head dim, plus one copy of k and v up to each group's end (T^2 / (2 G) rows in all,
transient); memory kept for backward: q, k, v, out and lse, as plain SDPA.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.model.engine.band import BAND_DTYPES, merge_lse
from attnlab.model.engine.folds import Columns, columns
from attnlab.model.engine.grouped import Call, with_columns

_fwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward

#: the smallest group of rows (groups are this times a power of two)
MIN_GROUP = 128


def _group_columns(call: Call, H: int, a: int, e: int, dtype, device) -> Columns | None:
    """The columns of rows [a, e) over keys [0, e), centred on the group's middle row (None:
    they would round more than the tolerance)."""
    q_pos = torch.arange(a, e, device=device)[None]
    kv_pos = torch.arange(e, device=device)[None]
    centre = torch.tensor([(a + e) // 2], device=device)
    cols, refused = columns(
        call.folded, H, q_pos, kv_pos, centre, call.scale, True, dtype, call.tol
    )
    return None if refused else cols


def centred_groups(call: Call, q: Tensor, Tk: int) -> list[tuple[int, int, Columns]] | None:
    """The groups ([a, e), columns) when this path can run the call (causal from position 0,
    square, CPU float32/64, softmax, no dropout, only exact columns with no gain after them;
    a gain before is applied to q by the caller), else None."""
    f, T = call.folded, q.shape[2]
    if q.device.type != "cpu" or q.dtype not in BAND_DTYPES or call.dropout or Tk != T:
        return None
    if call.q_offset or f.biases or f.general or not f.columns:
        return None
    if any(m is not None for _, m in f.columns) or call.normaliser.sdpa != "softmax":
        return None
    G = MIN_GROUP
    while G < T and _group_columns(call, q.shape[1], 0, min(2 * G, T), q.dtype, q.device):
        G *= 2
    groups = []
    for a in range(0, T, G):
        cols = _group_columns(call, q.shape[1], a, min(a + G, T), q.dtype, q.device)
        if cols is None:
            return None
        groups.append((a, min(a + G, T), cols))
    return groups


def _widened(q, k, v, a, e, cols, G):
    """Group [a, e)'s q and its keys [0, e) with the columns, at one 8-aligned head dim."""
    kr, vr = (k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)) if G > 1 else (k, v)
    return with_columns(q[:, :, a:e], kr[:, :, :e], vr[:, :, :e], cols, q.shape[0], kr.shape[1])


class CentredCausal(torch.autograd.Function):
    """Causal softmax attention with per-group folded columns (``centred_groups``)."""

    @staticmethod
    def forward(ctx, q, k, v, scale: float, groups):
        G, dv = q.shape[1] // k.shape[1], v.shape[-1]
        outs, lses = [], []
        for a, e, cols in groups:
            qg, kg, vg = _widened(q, k, v, a, e, cols, G)
            o, lse = _fwd(qg, kg[:, :, a:], vg[:, :, a:], 0.0, True, scale=scale)
            if a:
                o_f, lse_f = _fwd(qg, kg[:, :, :a], vg[:, :, :a], 0.0, False, scale=scale)
                o, lse = merge_lse(o, lse, o_f, lse_f)
            outs.append(o[..., :dv])
            lses.append(lse)
        out, lse = torch.cat(outs, 2), torch.cat(lses, 2)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.scale, ctx.groups, ctx.G = scale, groups, G
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        scale, G = ctx.scale, ctx.G
        d, dv = q.shape[-1], v.shape[-1]
        dq = torch.zeros_like(q)
        dk = torch.zeros(*q.shape[:2], k.shape[2], d, dtype=k.dtype, device=k.device)
        dvv = torch.zeros(*q.shape[:2], v.shape[2], dv, dtype=v.dtype, device=v.device)
        for a, e, cols in ctx.groups:
            qg, kg, vg = _widened(q, k, v, a, e, cols, G)
            pad = (0, qg.shape[-1] - dv)
            og, dg = F.pad(out[:, :, a:e], pad), F.pad(dout[:, :, a:e], pad)
            lg = lse[:, :, a:e]
            g = _bwd(dg, qg, kg[:, :, a:], vg[:, :, a:], og, lg, 0.0, True, scale=scale)
            dq[:, :, a:e] += g[0][..., :d]
            dk[:, :, a:e] += g[1][..., :d]
            dvv[:, :, a:e] += g[2][..., :dv]
            if a:
                g = _bwd(dg, qg, kg[:, :, :a], vg[:, :, :a], og, lg, 0.0, False, scale=scale)
                dq[:, :, a:e] += g[0][..., :d]
                dk[:, :, :a] += g[1][..., :d]
                dvv[:, :, :a] += g[2][..., :dv]
        if G > 1:
            dk, dvv = dk.unflatten(1, (-1, G)).sum(2), dvv.unflatten(1, (-1, G)).sum(2)
        return dq, dk, dvv, None, None


def run_centred(q: Tensor, k: Tensor, v: Tensor, call: Call, groups) -> Tensor:
    """The call on this path (a gain folded into q first)."""
    if call.folded.gain is not None:
        q = q * call.folded.gain.to(q.dtype).view(1, q.shape[1], 1, 1)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    return CentredCausal.apply(q, k, v, call.scale, groups)
