"""A causal bias that is constant beyond a band: plain SDPA over the far keys, a float bias over
the band, merged by log-sum-exp (T5's buckets on CPU).

A bias mod may declare ``band = D``: for causal pairs, ``bias(h, i, j)`` is the same per head
(``c_h = bias(h, D, 0)``) whenever ``i - j >= D``. Softmax is shift-invariant per row, so with
``b'(h, i, j) = bias(h, i, j) - c_h`` the attention is unchanged and ``b'`` is zero outside
the band ``0 <= i - j < D``. So, with s = scale q . k::

    far:  (o_f, lse_f) = SDPA(q[D:], k[:T-D], v[:T-D], is_causal)    keys i - j >= D, no bias
    band: (o_b, lse_b) = SDPA per query block of D rows over its own and the previous key
          block, float mask b' (-inf outside the band): [H, D, 2D], the same for every block
    lse = logaddexp(lse_f, lse_b),   out = o_f exp(lse_f - lse) + o_b exp(lse_b - lse)

Backward (``BandedBias``): each part's kernel backward gets the merged ``out`` and ``lse``, so
its P = exp(s + b' - lse) is the row's global weight and rowsum(dO * out) the global one: the
two parts' dq, dk, dv add up to the exact gradient (as ring attention splits keys). The bias's
own gradient is dS = P (dO v^T - rowsum(dO * out)) over the band only, recomputed in backward
and handed to the graph of ``b'`` (which ``make_bias`` rebuilds from the mod's parameters);
``c_h``'s gradient, minus the band's dS summed, equals the far keys' (a softmax row's dS sums
to 0), so nothing beyond the band needs a gradient.

Cost: the far part is causal SDPA on T - D rows (fused, blocks above the diagonal skipped), the
band 2 D keys per row (half of them masked), dS in backward over the band: O(B H T D) time and
memory beyond causal SDPA's, never H T^2.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.model.engine.grouped import Call, learned_params
from attnlab.model.engine.plan import Plan

_fwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward

#: dtypes the band path runs in (half precision keeps the float-bias path: its bias in float32)
BAND_DTYPES = (torch.float32, torch.float64)


def band_bias(bias: Callable, H: int, D: int, rows: int, device, dtype) -> Tensor:
    """[H, rows, D + rows]: b' for a query block of ``rows`` rows over the D + rows keys that
    end with it (key c of the window sits D - c + r before row r), -inf outside the band."""
    h = torch.arange(H, device=device).view(1, H, 1, 1)
    r = torch.arange(rows, device=device).view(1, 1, rows, 1) + D
    c = torch.arange(D + rows, device=device).view(1, 1, 1, D + rows)
    zero = torch.zeros(1, dtype=torch.long, device=device).view(1, 1, 1, 1)
    b = bias(zero, h, r, c) - bias(zero, h, zero + D, zero)  # minus c_h: [1, H, 1, 1]
    inside = (c <= r) & (r - c < D)
    return b.masked_fill(~inside, float("-inf"))[0].to(dtype)


class _Blocks:
    """q cut into query blocks of ``rows`` rows ([B nb, H, rows, ...]), each with the D + rows
    keys that end with it ([B nb, H, D + rows, d]; D a multiple of ``rows``; keys before
    position 0 are zeros that ``mask`` hides)."""

    def __init__(self, q: Tensor, D: int, rows: int) -> None:
        B, H, T, _ = q.shape
        self.B, self.H, self.T, self.D, self.R = B, H, T, D, rows
        self.nb = -(-T // rows)
        self.Tp = self.nb * rows

    def rows(self, x: Tensor) -> Tensor:
        """[B, H, T, ...] -> [B nb, H, rows, ...] (rows past T zero)."""
        pad = [0, 0] * (x.dim() - 3) + [0, self.Tp - self.T]
        x = F.pad(x, pad) if self.Tp != self.T else x
        x = x.unflatten(2, (self.nb, self.R)).transpose(1, 2)
        return x.reshape(self.B * self.nb, self.H, self.R, *x.shape[4:])

    def unrows(self, x: Tensor) -> Tensor:
        """The inverse of ``rows``: [B nb, H, rows, ...] -> [B, H, T, ...]."""
        x = x.unflatten(0, (self.B, self.nb)).transpose(1, 2).flatten(2, 3)
        return x[:, :, : self.T]

    def keys(self, x: Tensor) -> Tensor:
        """[B, H, T, d] -> [B nb, H, D + rows, d]: block b's window, positions b rows - D on."""
        x = F.pad(x, (0, 0, self.D, self.Tp - self.T))
        x = x.unfold(2, self.D + self.R, self.R).transpose(-1, -2)  # [B, H, nb, D + rows, d]
        return x.transpose(1, 2).reshape(self.B * self.nb, self.H, self.D + self.R, x.shape[-1])

    def unkeys(self, x: Tensor) -> Tensor:
        """The adjoint of ``keys``: each window's key gradients added back to [B, H, T, d]."""
        s, nb = self.D // self.R, self.nb
        x = x.unflatten(0, (self.B, nb)).transpose(1, 2)  # [B, H, nb, D + rows, d]
        x = x.unflatten(3, (s + 1, self.R))  # [B, H, nb, s + 1, rows, d]
        out = x.new_zeros(self.B, self.H, nb + s, self.R, x.shape[-1])
        for t in range(s + 1):  # sub-block t of window b is block b + t - s
            out[:, :, t : t + nb] += x[:, :, :, t]
        return out[:, :, s:].flatten(2, 3)[:, :, : self.T]

    def mask(self, bias: Tensor) -> Tensor:
        """[B nb, H, rows, D + rows]: ``band_bias`` for every block, -inf at the keys before
        position 0 (a copy: O(B T H D), the band's own size)."""
        c = torch.arange(self.D + self.R, device=bias.device)
        start = torch.arange(self.nb, device=bias.device)[:, None] * self.R - self.D
        before = torch.zeros(self.nb, self.D + self.R, dtype=bias.dtype, device=bias.device)
        before = before.masked_fill(start + c < 0, float("-inf"))
        return (bias[None] + before[:, None, None]).repeat(self.B, 1, 1, 1)


def merge_lse(o_f: Tensor, lse_f: Tensor, o_b: Tensor, lse_b: Tensor) -> tuple[Tensor, Tensor]:
    """Two softmax attentions over disjoint keys of the same rows as one: (out, lse)."""
    lse = torch.logaddexp(lse_f, lse_b)
    out = o_f * (lse_f - lse).exp()[..., None] + o_b * (lse_b - lse).exp()[..., None]
    return out, lse


class BandedBias(torch.autograd.Function):
    """out = softmax(scale q k^T + bias, causal) v for a bias constant beyond ``D`` keys
    (``make_bias()`` -> ``band_bias``'s [H, rows, D + rows]), gradients for q, k, v and
    ``params``; the band in query blocks of ``rows`` rows (D a multiple of it)."""

    @staticmethod
    def forward(ctx, q, k, v, scale: float, D: int, rows: int, make_bias, *params):
        G = q.shape[1] // k.shape[1]
        kr, vr = (k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)) if G > 1 else (k, v)
        with torch.no_grad():
            bias = make_bias()
        bl = _Blocks(q, D, rows)
        qb, kb, vb = bl.rows(q), bl.keys(kr), bl.keys(vr)
        o_b, lse_b = _fwd(qb, kb, vb, 0.0, False, attn_mask=bl.mask(bias), scale=scale)
        out, lse = bl.unrows(o_b), bl.unrows(lse_b)
        if q.shape[2] > D:
            o_f, lse_f = _fwd(q[:, :, D:], kr[:, :, :-D], vr[:, :, :-D], 0.0, True, scale=scale)
            o_near, l_near = merge_lse(o_f, lse_f, out[:, :, D:], lse[:, :, D:])
            out = torch.cat([out[:, :, :D], o_near], 2)
            lse = torch.cat([lse[:, :, :D], l_near], 2)
        ctx.save_for_backward(q, k, v, out, lse, *params)
        ctx.scale, ctx.D, ctx.R, ctx.make_bias, ctx.groups = scale, D, rows, make_bias, G
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, *params = ctx.saved_tensors
        G, D, scale = ctx.groups, ctx.D, ctx.scale
        kr, vr = (k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)) if G > 1 else (k, v)
        dout = dout.contiguous()
        with torch.enable_grad():
            bias = ctx.make_bias()
        bl = _Blocks(q, D, ctx.R)
        mask = bl.mask(bias.detach())
        qb, kb, vb = bl.rows(q), bl.keys(kr), bl.keys(vr)
        ob, db, lb = bl.rows(out).contiguous(), bl.rows(dout).contiguous(), bl.rows(lse)
        # rows past T (zero q, dO and out) get lse 0: their P = exp(b') stays finite
        dqb, dkb, dvb = _bwd(db, qb, kb, vb, ob, lb, 0.0, False, attn_mask=mask, scale=scale)
        dq, dk, dv = bl.unrows(dqb), bl.unkeys(dkb), bl.unkeys(dvb)
        if q.shape[2] > D:
            f = _bwd(
                dout[:, :, D:], q[:, :, D:], kr[:, :, :-D], vr[:, :, :-D], out[:, :, D:],
                lse[:, :, D:], 0.0, True, scale=scale,
            )  # fmt: skip
            dq = dq + F.pad(f[0], (0, 0, D, 0))
            dk = dk + F.pad(f[1], (0, 0, 0, D))
            dv = dv + F.pad(f[2], (0, 0, 0, D))
        if G > 1:
            dk, dv = dk.unflatten(1, (-1, G)).sum(2), dv.unflatten(1, (-1, G)).sum(2)
        grads = [None] * len(params)
        if params:  # dS over the band, recomputed, into the bias's own graph
            ds = _band_ds(qb, kb, vb, ob, db, lb, mask, scale)
            grads = torch.autograd.grad(bias, params, ds, allow_unused=True)
        return (dq, dk, dv, None, None, None, None, *grads)


def _band_ds(qb, kb, vb, ob, db, lb, mask, scale: float) -> Tensor:
    """dS = P (dO v^T - rowsum(dO * out)), P = exp(scale q k^T + mask - lse), over the band's
    [B nb, H, rows, K] pairs, summed over blocks and batch -> [H, rows, K] (two fused
    multiply-adds and two in-place passes over the band)."""
    n, H, R, K = mask.shape
    flat = lambda t: t.reshape(n * H, *t.shape[2:])  # noqa: E731
    s = torch.baddbmm(flat(mask - lb[..., None]), flat(qb), flat(kb).transpose(1, 2), alpha=scale)
    delta = -(db * ob).sum(-1, keepdim=True)
    dp = torch.baddbmm(flat(delta), flat(db), flat(vb).transpose(1, 2))
    return s.exp_().mul_(dp).view(n, H, R, K).sum(0)


def banded_bias(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float,
    D: int,
    make_bias: Callable[[int], Tensor],
    params: list[Tensor],
    rows: int | None = None,
) -> Tensor:
    """The call above: q [B, H, T, d], k/v [B, H_kv, T, d], causal from position 0;
    ``make_bias(rows)`` -> ``band_bias`` (``rows``: the band's query block, default
    :func:`band_rows`)."""
    rows = band_rows(D) if rows is None else rows
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    return BandedBias.apply(q, k, v, scale, D, rows, lambda: make_bias(rows), *params)


def band_rows(D: int) -> int:
    """The band's query block: D / 2 when D is even and >= 64 (a window of 1.5 D keys; D rows
    would compute 2 D), else D."""
    return D // 2 if D % 2 == 0 and D >= 64 else D


def band_width(call: Call, q: Tensor, Tk: int) -> int | None:
    """D when ``call`` (causal from position 0, square) can run here: CPU, float32/64, softmax,
    no dropout, every mod a bias declaring a band (no gain, columns or general mod), Tk > D."""
    f = call.folded
    if q.device.type != "cpu" or q.dtype not in BAND_DTYPES or call.dropout:
        return None
    if call.normaliser.sdpa != "softmax" or not call.normaliser.shift_invariant:
        return None
    if f.gain is not None or f.columns or f.general or not f.biases or q.shape[2] != Tk:
        return None
    bands = [m.band() if c is None else None for m, c in f.biases]
    if None in bands or call.q_offset or Tk <= max(bands):
        return None
    return max(bands)


def run_banded(q: Tensor, k: Tensor, v: Tensor, call: Call, D: int) -> Tensor:
    """The call on the band path (``band_width`` said D)."""
    mods = [m for m, _ in call.folded.biases]
    H = q.shape[1]

    def bias(b, h, i, j):
        total = 0
        for m in mods:
            val = m.bias(b, h, i, j)
            if val is None:
                val = m.score_mod(torch.zeros((), dtype=q.dtype, device=q.device), b, h, i, j)
            total = total + val
        return total

    make = lambda rows: band_bias(bias, H, D, rows, q.device, q.dtype)  # noqa: E731
    params = learned_params(mods, tuple(mods))
    return banded_bias(q, k, v, call.scale, D, make, params)


def band_plan(call: Call, D: int) -> Plan:
    """The line that says this path runs."""
    names = " + ".join(type(m).__name__ for m, _ in call.folded.biases)
    why = f"mask is causal, {names} is one value per head beyond {D} keys"
    how = "is_causal SDPA over the far keys + a float bias over the band, merged by log-sum-exp"
    return Plan("block_sparse", f"{why}; {how}")
