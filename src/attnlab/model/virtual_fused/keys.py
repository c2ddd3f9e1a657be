"""``on = "logits"``: virtual heads as ordinary attention over convolved keys.

With ``s[h, i, j] = q_(h,i) . k_(h,j)`` (scale aside), a virtual head of group g reads

    s'[h', i, j] = sum_(l < G) sum_(a, b) w[h', l, a, b] s[gG + l, i + alpha_a, j + beta_b]
                 = Q_g(i) . Khat_h'(j),
    Q_g(i)     = [q_(gG+l, i+alpha_a)]            over (l, a):  width G * n_alpha * d_h,
    Khat_h'(j) = [sum_b w[h', l, a, b] k_(gG+l, j+beta_b)]  over (l, a),

q and k zero outside the sequence (and at padded tokens), which is exactly the zero padding of
the materialised convolution. So one ``scaled_dot_product_attention`` call over H' heads of width
W = G * n_alpha * d_h gives every virtual head: QK^T costs W / d_h = G (1-D) or G * K (2-D) times
the baseline's, P V is unchanged, memory is O(T * H' * W). The causal mask is unchanged too: the
1-D taps read keys j - t <= j <= i only.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.model.virtual_fused.geometry import Geometry, repeat_heads, shifts


def stacked_queries(q: Tensor, geo: Geometry) -> Tensor:
    """q [B, H, Tq, d] -> Q [B, H', Tq, G * n_alpha * d] (each group's rows for its V heads)."""
    B, _, Tq, d = q.shape
    alphas = geo.alphas
    qs = q.unsqueeze(3) if len(alphas) == 1 else torch.stack(shifts(q, alphas), 3)
    n, G, V = geo.n_groups, geo.G, geo.V
    width = G * len(alphas) * d
    Q = qs.reshape(B, n, G, Tq, len(alphas), d).permute(0, 1, 3, 2, 4, 5).reshape(B, n, Tq, width)
    if V == 1:
        return Q
    return Q.unsqueeze(2).expand(B, n, V, Tq, width).reshape(B, n * V, Tq, width)


def convolved_keys(k: Tensor, w: Tensor, geo: Geometry) -> Tensor:
    """k [B, H_kv, Tk, d] -> Khat [B, H', Tk, G * n_alpha * d] for the compact weight ``w``."""
    kh = repeat_heads(k, geo.H)
    B, H, Tk, d = kh.shape
    n, V, G = geo.n_groups, geo.V, geo.G
    taps = geo.taps(w)  # [n, V, G, n_alpha, n_beta]
    n_alpha = taps.shape[3]
    if G == 1 and n_alpha == 1 and V == 1:  # per-head 1-D: a depthwise causal conv of the keys
        out = None
        for t, kt in enumerate(shifts(kh, geo.betas)):
            term = taps[:, 0, 0, 0, t].view(1, H, 1, 1) * kt
            out = term if out is None else out + term
        return out
    ks = torch.stack(shifts(kh, geo.betas), 0).view(-1, B, n, G, Tk, d)
    khat = torch.einsum("gvlxy,yzgljd->zgvjlxd", taps, ks)
    return khat.reshape(B, n * V, Tk, G * n_alpha * d)
