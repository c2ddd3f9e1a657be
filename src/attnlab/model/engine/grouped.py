"""Run a layout's stacks: one SDPA call (block-sparse path) or one materialised block (explicit
path) per stack, then put the rows back in order.

The call's q, k, v are laid out once as [B, T, H, d]; a stack of n groups gathers its rows in one
``index_select`` each, seen as [B n, H, L, d] (the group joins the batch axis, so the heads keep
SDPA's GQA mapping and a mask shared by the heads broadcasts over them), and evaluates the mask
on its own n Q K pairs. SDPA path: gains multiply q, separable biases become extra q/k columns
(``folds``), other additive mods a float mask, the "sink" normaliser a zero key and value; a mask
the same for every group (a window's interior) is passed once. Explicit path: the mods in order,
the mask, the normaliser's own weights, then weights @ v. Memory per stack O(B H n Q K) for a
float bias or the explicit weights (never H T^2 for a sparse mask), O(n Q K) for a mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.model.engine.biased import biased_flash
from attnlab.model.engine.contracts import Mask, Normaliser, ScoreMod, mod_parameters
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


def rows_first(x: Tensor) -> Tensor:
    """[B, Hx, T, d] -> [B, T, Hx, d], contiguous (one copy per call; every gather reads it)."""
    return x.transpose(1, 2).contiguous()


def gather(xt: Tensor, idx: Tensor) -> Tensor:
    """``xt`` [B, T, Hx, d] at positions ``idx`` [n, L] -> [B n, Hx, L, d] (a view of one
    gathered copy)."""
    B, _, Hx, d = xt.shape
    n, L = idx.shape
    return xt.index_select(1, idx.reshape(-1)).view(B * n, L, Hx, d).transpose(1, 2)


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


def sdpa_stack(qt: Tensor, kt: Tensor, vt: Tensor, st: Stack, call: Call) -> Tensor:
    """One SDPA call over the stack's groups (inputs [B, T, H, d]) -> [B n, H, Q, d_v]."""
    B, _, H, _ = qt.shape
    Hkv, dv = kt.shape[2], vt.shape[-1]
    n, Q = st.q_idx.shape
    qs, ks, vs = gather(qt, st.q_idx), gather(kt, st.kv_idx), gather(vt, st.kv_idx)
    q_pos = call.q_offset + st.q_idx
    idx = indices(B, H, q_pos, st.kv_idx)
    allowed = allowed_pairs(call, st, idx)
    if call.folded.gain is not None:
        qs = qs * call.folded.gain.to(qs.dtype).view(1, H, 1, 1)
    shift = call.normaliser.shift_invariant
    cols, refused = columns(
        call.folded, H, q_pos, st.kv_idx, q_pos[:, Q // 2], call.scale, shift, qs.dtype, call.tol
    )
    as_bias = [m for m, _ in call.folded.biases + refused]
    sink = call.normaliser.sdpa == "sink"
    if sink:
        ks, vs, allowed, cols = with_sink(ks, vs, allowed, cols)
    if cols is not None:
        qs, ks, vs = with_columns(qs, ks, vs, cols, B, Hkv)

    def attn_mask(folded: Folded) -> Tensor | None:
        """The 4-D float mask (the mods' bias, -inf where masked) from ``folded`` (the
        learned-bias path rebuilds it in backward from a fresh fold of the mods)."""
        items = [(m, c) for m, c in folded.biases + folded.columns if m in as_bias]
        bias = float_bias(items, idx, qs.dtype)
        if bias is not None:  # every axis but batch and head at full size
            K = st.kv_idx.shape[1]
            bias = bias.expand(*torch.broadcast_shapes(bias.shape, (1, n, 1, Q, K)))
            bias = F.pad(bias, (0, 1)) if sink else bias
        return sdpa_mask(allowed, bias, B, qs.dtype)

    params = learned_params(as_bias, call.mods)
    if params and qs.device.type == "cpu" and not call.dropout:
        out = biased_flash(qs, ks, vs, call.scale, lambda: attn_mask(fold(call.mods)), params)
    else:
        out = F.scaled_dot_product_attention(
            qs,
            ks,
            vs,
            attn_mask=attn_mask(call.folded),
            dropout_p=call.dropout,
            scale=call.scale,
            enable_gqa=Hkv != H,
        )
    return out[..., :dv] if out.shape[-1] != dv else out


def learned_params(as_bias: list, mods) -> list[Tensor]:
    """The parameters a float bias's gradient reaches (none outside autograd): those of the
    bias mods and of every scale mod (a gain after a bias multiplies it)."""
    if not torch.is_grad_enabled() or not as_bias:
        return []
    involved = [m for m in mods if m in as_bias or getattr(m, "kind", "") == "scale"]
    return [p for m in involved for p in mod_parameters(m)]


def with_sink(ks, vs, allowed, cols):
    """One more key, all zeros (its logit is 0 whatever the mods), value zero, always allowed
    (a float bias gets its 0 there when it is built)."""
    ks = F.pad(ks, (0, 0, 0, 1))
    vs = F.pad(vs, (0, 0, 0, 1))
    allowed = F.pad(allowed, (0, 1), value=True)
    if cols is not None:
        cols.k = F.pad(cols.k, (0, 0, 0, 1))
    return ks, vs, allowed, cols


def with_columns(qs, ks, vs, cols, B: int, Hkv: int):
    """Append the fold columns to q [B n, H, Q, d] and k [B n, H_kv, K, d], and pad q, k, v to
    one 8-aligned head dim (SDPA's fused kernels want equal head dims)."""
    n, K, R = cols.k.shape
    qc = cols.q.expand(B, *cols.q.shape).reshape(B * n, *cols.q.shape[1:])
    kc = cols.k[None, :, None].expand(B, n, Hkv, K, R).reshape(B * n, Hkv, K, R)
    width = pad_to(max(qs.shape[-1] + R, vs.shape[-1]))

    def widen(t: Tensor, extra: Tensor | None = None) -> Tensor:
        """``t`` with ``extra`` and zeros appended up to ``width``: one copy (cat's)."""
        parts = [t] if extra is None else [t, extra.to(t.dtype)]
        have = sum(p.shape[-1] for p in parts)
        if have != width:
            parts.append(t.new_zeros(*t.shape[:-1], width - have))
        return torch.cat(parts, -1) if len(parts) > 1 else t

    return widen(qs, qc), widen(ks, kc), widen(vs)


def sdpa_mask(allowed: Tensor, bias: Tensor | None, B: int, dtype) -> Tensor | None:
    """SDPA's 4-D float attn_mask [B n or 1, H or 1, Q, K] from ``allowed`` [B|1, n, H|1, Q, K]
    and ``bias`` [B|1, n, H|1, Q, K] or None: the bias (0 without one), -inf where masked.
    Built here on the small tensor (SDPA would convert a boolean one at full size each call);
    a mask the same for every group is passed once (not while a gradient flows through it);
    None when every pair is allowed and there is no bias. A 4-D mask keeps the CPU flash
    kernel (a 3-D one falls to the math path)."""
    if bias is None:
        if bool(allowed.all()):
            return None
        m = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
        m = m.masked_fill_(~allowed, float("-inf"))
    else:
        m = bias.masked_fill(~allowed, float("-inf"))
    n = m.shape[1]
    if m.shape[0] == 1 and (n == 1 or (not m.requires_grad and bool((m == m[:, :1]).all()))):
        return m[:, 0]  # [1, H|1, Q, K]: broadcast over batch and groups
    if m.shape[0] == 1 and B > 1:
        m = m.expand(B, *m.shape[1:])
    return m.reshape(m.shape[0] * n, *m.shape[2:])


def explicit_stack(qt: Tensor, kt: Tensor, vt: Tensor, st: Stack, call: Call):
    """The materialised form over the stack's groups (inputs [B, T, H, d]) -> ([B n, H, Q,
    d_v], weights [B, n, H, Q, K]): the mods in order, the mask, the normaliser's weights
    (zero where masked)."""
    B, _, H, _ = qt.shape
    n, Q = st.q_idx.shape
    K = st.kv_idx.shape[1]
    G = H // kt.shape[2]
    qs, ks, vs = gather(qt, st.q_idx), gather(kt, st.kv_idx), gather(vt, st.kv_idx)
    if G > 1:
        ks, vs = ks.repeat_interleave(G, 1), vs.repeat_interleave(G, 1)
    idx = indices(B, H, call.q_offset + st.q_idx, st.kv_idx)
    s = ((qs @ ks.transpose(-1, -2)) * call.scale).view(B, n, H, Q, K)
    for mod in call.mods:
        s = mod.score_mod(s, *idx)
    allowed = allowed_pairs(call, st, idx)
    w = call.normaliser.weights(s, allowed).masked_fill(~allowed, 0.0)
    if call.dropout:
        w = F.dropout(w, call.dropout)
    return w.reshape(B * n, H, Q, K) @ vs, w


def run_layout(q: Tensor, k: Tensor, v: Tensor, layout: Layout, call: Call, explicit: bool):
    """Every stack, then the rows in the call's order (a row of a later stack wins; a row in
    no stack, with no key allowed, is 0) -> (out [B, H, Tq, d_v], weights of the last stack)."""
    B, H, Tq, _ = q.shape
    dv = v.shape[-1]
    qt, kt, vt = rows_first(q), rows_first(k), rows_first(v)
    parts, rows, weights = [], [], None
    for st in layout.stacks:
        if explicit:
            out, weights = explicit_stack(qt, kt, vt, st, call)
        else:
            out = sdpa_stack(qt, kt, vt, st, call)
        parts.append(out.transpose(1, 2).reshape(B, -1, H, dv))  # [B, n Q, H, d_v]
        rows.append(st.q_idx.reshape(-1))
    parts.append(q.new_zeros(B, 1, H, dv))
    flat = torch.cat(rows)
    where = torch.full((Tq,), flat.numel(), dtype=torch.long, device=q.device)
    where = where.scatter_reduce(
        0, flat, torch.arange(flat.numel(), device=q.device), "amax", include_self=False
    )
    return torch.cat(parts, 1).index_select(1, where).transpose(1, 2), weights
