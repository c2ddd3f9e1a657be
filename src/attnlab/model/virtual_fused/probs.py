"""``on = "probs"``: convolve the probabilities, mask and renormalise, without the T x T map.

With p the (masked) softmax of each head and ``p'[h', i, j] = sum w[h', l, a, b] p[h, i + a, j + b]``
(h = gG + l), a virtual head outputs ``N(i) / D(i)`` with ``N = sum_(j allowed) p'[., i, j] v_j``
and ``D`` the same with 1 in place of v_j (``D`` clamped at 1e-9, as the materialised form does).
Moving the key shift onto the values turns N into attention of each head h over convolved values,

    vtilde_(h', h, a)(m) = sum_b w[h', l, a, b] v_(m - beta_b),

(v zero outside the sequence and at padded tokens, so the image's zero padding holds) and the query
shift onto the outputs: ``N_h'(i) = sum_(l, a) A_(h, h', a)(i + alpha_a)``. One SDPA call per head
carries every (h', a) pair as value columns, with a column of ones for D. Bidirectional: that is
all. Cost: P V over V * n_alpha * (d_h + 1) columns per head (V = H' / n_groups); QK^T unchanged.

Causal 1-D (beta_t = -t): p' may only reach keys j <= i, so for query i the taps may only read
values m + t <= i. Keys m <= i - (K - 1) ("far") pass every tap; the K - 1 keys nearest the
diagonal ("near", m = i - r) pass only t <= r. The far part is attention over vtilde with the
diagonal moved K - 1 keys back; the near part needs p[h, i, i - r] itself. Both come out of one
SDPA call over K - 1 extra keys placed before the sequence: extra key r has the score
``s[h, i, i - r]`` (its query column holds q_i . k_(i-r), its key column a one), a one-hot value
column, and is visible to query i when r <= i. The call's softmax then has the full normaliser
(near keys + far keys = all keys <= i), its one-hot columns return ``p[h, i, i - r]`` exactly, and
no value after position i is ever read (no future token can leak, not even by rounding). Then

    N_h'(i) = far_h'(i) + sum_(u < K-1) C_u(h', i) v_(i - u),
    C_u(h', i) = sum_l sum_(r = u .. K-2) p[gG + l, i, i - r] w[h', l, r - u].

Cost: QK^T over d_h + K - 1 columns and T + K - 1 keys; P V over V (d_h + 1) + K - 1 columns.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.model.virtual_fused.geometry import Geometry, repeat_heads, shift, shifts
from attnlab.model.virtual_fused.sdpa import attend
from attnlab.parts import ScoreContext


def _values_with_ones(v: Tensor, padding: Tensor | None) -> Tensor:
    """[B, H_kv, T, d] -> [B, H_kv, T, d + 1]: a column of ones for the normaliser, all zero at
    padded tokens."""
    ext = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
    if padding is not None:
        ext = ext * padding[:, None, :, None].to(ext.dtype)
    return ext


def _ratio(out: Tensor, d: int) -> Tensor:
    return out[..., :d] / out[..., d:].clamp_min(1e-9)


def bidirectional_probs(
    q: Tensor, k: Tensor, v: Tensor, w: Tensor, geo: Geometry, core, ctx: ScoreContext
) -> Tensor:
    """Virtual heads [B, H', T, d] of a bidirectional stack (1-D or 2-D taps)."""
    B, H, T, d = q.shape
    n, V, G = geo.n_groups, geo.V, geo.G
    taps = geo.taps(w)  # [n, V, G, n_alpha, n_beta]
    n_alpha = taps.shape[3]
    ve = geo.value_heads(_values_with_ones(v, ctx.padding))  # [B, H', T, d + 1]
    e = d + 1
    vs = torch.stack(shifts(ve, [-b for b in geo.betas]), 0).view(-1, B, n, V, T, e)
    vt = torch.einsum("gvlxy,yzgvmd->zglmvxd", taps, vs).reshape(B, H, T, V * n_alpha * e)
    sctx = ScoreContext(None, False, None, False, ctx.padding)
    a = attend(core, q, repeat_heads(k, H), vt, sctx).view(B, n, G, T, V, n_alpha, e).sum(2)
    if ctx.padding is not None:  # a padded query's row is outside the image
        a = a * ctx.padding[:, None, :, None, None, None].to(a.dtype)
    out = None
    for x, alpha in enumerate(geo.alphas):
        term = shift(a[:, :, :, :, x], alpha, dim=2)  # [B, n, T, V, e]: row i reads i + alpha
        out = term if out is None else out + term
    out = out.permute(0, 1, 3, 2, 4).reshape(B, n * V, T, e)
    return _ratio(out, d)


def causal_probs(
    q: Tensor, k: Tensor, v: Tensor, w: Tensor, geo: Geometry, core, offset: int
) -> Tensor:
    """Virtual heads [B, H', Tq, d] of a causal stack (1-D taps); queries sit at positions
    offset + i over keys 0 .. Tk - 1 (offset > 0 when decoding against a KV cache). ``q`` and
    ``k`` may carry extra columns (ALiBi); ``v`` has the head width d."""
    B, H, Tq, dq = q.shape
    d = v.shape[-1]
    Tk = k.shape[2]
    n, V, G, K = geo.n_groups, geo.V, geo.G, geo.K
    R = K - 1
    taps = geo.taps(w)[:, :, :, 0]  # [n, V, G, K]
    kh = repeat_heads(k, H)
    e = d + 1
    ve = geo.value_heads(_values_with_ones(v, None))  # [B, H', Tk, e]
    vs = torch.stack(shifts(ve, list(range(K))), 0).view(K, B, n, V, Tk, e)
    vt = torch.einsum("gvlt,tzgvmd->zglmvd", taps, vs).reshape(B, H, Tk, V * e)
    if R:
        near = [(q * kr[:, :, offset:]).sum(-1) for kr in shifts(kh, [-r for r in range(R)])]
        q = torch.cat([q, torch.stack(near, -1)], dim=-1)
        eye = torch.eye(R, dtype=q.dtype, device=q.device)
        k_extra = torch.cat([kh.new_zeros(R, dq), eye], dim=-1).expand(B, H, R, dq + R)
        kh = torch.cat([k_extra, torch.cat([kh, kh.new_zeros(B, H, Tk, R)], -1)], dim=2)
        v_extra = torch.cat([vt.new_zeros(R, V * e), eye], dim=-1).expand(B, H, R, V * e + R)
        vt = torch.cat([v_extra, torch.cat([vt, vt.new_zeros(B, H, Tk, R)], -1)], dim=2)
    if offset == 0:
        sctx = ScoreContext(None, True)  # top-left aligned: extra key r visible from query r on
    else:
        allowed = torch.ones(Tq, R + Tk, dtype=torch.bool, device=q.device).tril(offset)
        sctx = ScoreContext(allowed, False)
    a = attend(core, q, kh, vt, sctx)  # [B, H, Tq, V * e + R]
    far = a[..., : V * e].reshape(B, n, G, Tq, V, e).sum(2)
    out = far.permute(0, 1, 3, 2, 4).reshape(B, n * V, Tq, e)
    if R:
        p = a[..., V * e :].reshape(B, n, G, Tq, R)
        back = shifts(ve, [-u for u in range(R)])  # v at position offset + i - u
        for u in range(R):
            c = torch.einsum("zglir,gvlr->zgvi", p[..., u:], taps[..., : R - u])
            out = out + c.reshape(B, n * V, Tq, 1) * back[u][:, :, offset:]
    return _ratio(out, d)
