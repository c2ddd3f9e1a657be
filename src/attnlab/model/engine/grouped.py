"""Run a layout's stacks: one SDPA call (block-sparse path) or one materialised block (explicit
path) per stack, then put the rows back in order.

A stack of n groups gathers its queries [B, n H, Q, d] and keys/values [B, n H_kv, K, d] (the
group index joins the head axis, so SDPA's GQA mapping of head h to h // (H / H_kv) stays right)
and evaluates the mask on its own n Q K pairs. SDPA path: gains multiply q, separable biases
become extra q/k columns (``folds``), other additive mods a float mask [., n H, Q, K], the
"sink" normaliser a zero key and value. Explicit path: the mods in order, the mask, the
normaliser's own weights, then weights @ v. Memory per stack O(B H n Q K) for a float bias or
the explicit weights (never H T^2 for a sparse mask), O(H n Q K) bytes for a boolean mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.model.engine.biased import biased_flash
from attnlab.model.engine.contracts import Mask, Normaliser, ScoreMod
from attnlab.model.engine.folds import Folded, columns, fold, pad_to
from attnlab.model.engine.layout import Layout, Stack


@dataclass
class Call:
    """What every stack of one call shares."""

    mask: Mask
    mods: tuple[ScoreMod, ...]
    folded: Folded
    normaliser: Normaliser
    scale: float
    q_offset: int
    dropout: float
    tol: float


def gather(x: Tensor, idx: Tensor) -> Tensor:
    """x [B, Hx, T, d] at positions ``idx`` [n, L] -> [B, n Hx, L, d] (group-major heads)."""
    B, Hx, _, d = x.shape
    n, L = idx.shape
    g = x.index_select(2, idx.reshape(-1)).view(B, Hx, n, L, d)
    return g.transpose(1, 2).reshape(B, n * Hx, L, d)


def indices(B: int, H: int, q_pos: Tensor, kv_pos: Tensor) -> tuple[Tensor, ...]:
    """Broadcast (b, h, q_idx, kv_idx) over [B, n, H, Q, K] for the mods and the mask."""
    dev = q_pos.device
    b = torch.arange(B, device=dev).view(B, 1, 1, 1, 1)
    h = torch.arange(H, device=dev).view(1, 1, H, 1, 1)
    return b, h, q_pos[None, :, None, :, None], kv_pos[None, :, None, None, :]


def allowed_pairs(call: Call, st: Stack, idx: tuple[Tensor, ...]) -> Tensor:
    """[B|1, n, H|1, Q, K] bool: the mask on the stack's pairs, padding slots excluded."""
    ok = call.mask.mask_mod(*idx) & st.kv_real[None, :, None, None, :]
    n, Q = st.q_idx.shape
    return ok.expand(ok.shape[0], n, ok.shape[2], Q, st.kv_idx.shape[1])


def float_bias(items, idx: tuple[Tensor, ...], dtype: torch.dtype) -> Tensor | None:
    """Sum of each additive mod's bias times its head multiplier, in ``dtype`` (float32 for
    half inputs, as the dense path always did)."""
    work = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    total = None
    for mod, mult in items:
        val = mod.bias(*idx)
        if val is None:
            val = mod.score_mod(torch.zeros((), dtype=work, device=idx[0].device), *idx)
        if mult is not None:
            val = val * mult.to(work)[idx[1]]
        total = val if total is None else total + val
    return None if total is None else total.to(dtype)


def sdpa_stack(q: Tensor, k: Tensor, v: Tensor, st: Stack, call: Call) -> Tensor:
    """One SDPA call over the stack's groups -> [B, n H, Q, d_v]."""
    B, H = q.shape[:2]
    n, Q = st.q_idx.shape
    dv = v.shape[-1]
    qs, ks, vs = gather(q, st.q_idx), gather(k, st.kv_idx), gather(v, st.kv_idx)
    q_pos = call.q_offset + st.q_idx
    idx = indices(B, H, q_pos, st.kv_idx)
    allowed = allowed_pairs(call, st, idx)
    if call.folded.gain is not None:
        qs = qs * call.folded.gain.to(q.dtype).repeat(n).view(1, n * H, 1, 1)
    shift = call.normaliser.shift_invariant
    cols, refused = columns(
        call.folded, H, q_pos, st.kv_idx, q_pos[:, Q // 2], call.scale, shift, q.dtype, call.tol
    )
    as_bias = [m for m, _ in call.folded.biases + refused]
    sink = call.normaliser.sdpa == "sink"
    if sink:
        ks, vs, allowed, cols = with_sink(ks, vs, allowed, cols)
    if cols is not None:
        qs, ks, vs = with_columns(qs, ks, vs, cols, B, H, k.shape[1])

    def attn_mask(folded: Folded) -> Tensor | None:
        """The 4-D mask: boolean, or the mods' float bias (-inf where masked) from ``folded``
        (the learned-bias path rebuilds it in backward from a fresh fold of the mods)."""
        items = [(m, c) for m, c in folded.biases + folded.columns if m in as_bias]
        bias = float_bias(items, idx, q.dtype)
        if bias is not None:  # every axis but batch and head at full size
            K = st.kv_idx.shape[1]
            bias = bias.expand(*torch.broadcast_shapes(bias.shape, (1, n, 1, Q, K)))
            bias = F.pad(bias, (0, 1)) if sink else bias
        return _sdpa_mask(allowed, bias, H)

    params = _learned(as_bias, call.mods)
    if params and q.device.type == "cpu" and not call.dropout:
        out = biased_flash(qs, ks, vs, call.scale, lambda: attn_mask(fold(call.mods)), params)
    else:
        out = F.scaled_dot_product_attention(
            qs,
            ks,
            vs,
            attn_mask=attn_mask(call.folded),
            dropout_p=call.dropout,
            scale=call.scale,
            enable_gqa=k.shape[1] != H,
        )
    return out[..., :dv] if out.shape[-1] != dv else out


def _learned(as_bias: list, mods) -> list[Tensor]:
    """The parameters a float bias's gradient reaches (none outside autograd): those of the
    bias mods and of every scale mod (a gain after a bias multiplies it)."""
    if not torch.is_grad_enabled() or not as_bias:
        return []
    involved = [m for m in mods if m in as_bias or getattr(m, "kind", "") == "scale"]
    return [
        p for m in involved if isinstance(m, nn.Module) for p in m.parameters() if p.requires_grad
    ]


def with_sink(ks, vs, allowed, cols):
    """One more key, all zeros (its logit is 0 whatever the mods), value zero, always allowed
    (a float bias gets its 0 there when it is built)."""
    ks = F.pad(ks, (0, 0, 0, 1))
    vs = F.pad(vs, (0, 0, 0, 1))
    allowed = F.pad(allowed, (0, 1), value=True)
    if cols is not None:
        cols.k = F.pad(cols.k, (0, 0, 0, 1))
    return ks, vs, allowed, cols


def with_columns(qs, ks, vs, cols, B: int, H: int, Hkv: int):
    """Append the fold columns to q and k, and pad q, k, v to one 8-aligned head dim."""
    n, K, R = cols.k.shape
    Q = qs.shape[2]
    qc = cols.q.reshape(1, n * H, Q, R).expand(B, -1, -1, -1)
    kc = cols.k[None, :, None].expand(B, n, Hkv, K, R).reshape(B, n * Hkv, K, R)
    qs, ks = torch.cat([qs, qc], -1), torch.cat([ks, kc], -1)
    width = pad_to(max(qs.shape[-1], vs.shape[-1]))
    pad = lambda t: F.pad(t, (0, width - t.shape[-1])) if t.shape[-1] != width else t  # noqa: E731
    return pad(qs), pad(ks), pad(vs)


def _sdpa_mask(allowed: Tensor, bias: Tensor | None, H: int) -> Tensor | None:
    """SDPA's 4-D attn_mask [B|1, n H, Q, K]: boolean, or the float bias with -inf where masked
    (a 4-D mask keeps the CPU flash kernel; a 3-D one falls to the math path). None when every
    pair is allowed and there is no bias."""
    if bias is None:
        if bool(allowed.all()):
            return None
        m = allowed
    else:
        m = bias.masked_fill(~allowed, float("-inf"))
    Bm, n, Hm, Q, K = m.shape[0], allowed.shape[1], m.shape[2], m.shape[3], m.shape[4]
    return (
        m.expand(Bm, n, H, Q, K).reshape(Bm, n * H, Q, K) if Hm == 1 else m.reshape(Bm, n * H, Q, K)
    )


def explicit_stack(q: Tensor, k: Tensor, v: Tensor, st: Stack, call: Call):
    """The materialised form over the stack's groups -> ([B, n H, Q, d_v], weights [B, n, H,
    Q, K]): the mods in order, the mask, the normaliser's weights (zero where masked)."""
    B, H, _, d = q.shape
    n, Q = st.q_idx.shape
    K = st.kv_idx.shape[1]
    G = H // k.shape[1]
    qs, ks, vs = gather(q, st.q_idx), gather(k, st.kv_idx), gather(v, st.kv_idx)
    if G > 1:
        ks = ks.view(B, n, -1, K, d).repeat_interleave(G, 2).view(B, n * H, K, d)
        vs = vs.view(B, n, -1, K, vs.shape[-1]).repeat_interleave(G, 2).view(B, n * H, K, -1)
    idx = indices(B, H, call.q_offset + st.q_idx, st.kv_idx)
    s = ((qs @ ks.transpose(-1, -2)) * call.scale).view(B, n, H, Q, K)
    for mod in call.mods:
        s = mod.score_mod(s, *idx)
    allowed = allowed_pairs(call, st, idx)
    w = call.normaliser.weights(s, allowed).masked_fill(~allowed, 0.0)
    if call.dropout:
        w = F.dropout(w, call.dropout)
    return w.reshape(B, n * H, Q, K) @ vs, w


def run_layout(q: Tensor, k: Tensor, v: Tensor, layout: Layout, call: Call, explicit: bool):
    """Every stack, then the rows in the call's order (a row of a later stack wins; a row in
    no stack, with no key allowed, is 0) -> (out [B, H, Tq, d_v], weights of the last stack)."""
    B, H, Tq, _ = q.shape
    dv = v.shape[-1]
    parts, rows, weights = [], [], None
    for st in layout.stacks:
        if explicit:
            out, weights = explicit_stack(q, k, v, st, call)
        else:
            out = sdpa_stack(q, k, v, st, call)
        n, Q = st.q_idx.shape
        parts.append(out.view(B, n, H, Q, dv).transpose(1, 2).reshape(B, H, n * Q, dv))
        rows.append(st.q_idx.reshape(-1))
    parts.append(q.new_zeros(B, H, 1, dv))
    flat = torch.cat(rows)
    where = torch.full((Tq,), flat.numel(), dtype=torch.long, device=q.device)
    where = where.scatter_reduce(
        0, flat, torch.arange(flat.numel(), device=q.device), "amax", include_self=False
    )
    return torch.cat(parts, 2).index_select(2, where), weights
