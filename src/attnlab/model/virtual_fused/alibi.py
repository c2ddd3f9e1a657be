"""ALiBi as two extra query/key columns, so a convolution of the keys convolves the bias too.

Causal ALiBi adds ``m_h (j - i)`` to the logit of query position i and key j <= i. It is the
dot product of augmented vectors: with the softmax scale ``s``,

    s * ([q_i, m_h / s, -m_h i / s] . [k_j, j, 1]) = s * q_i . k_j + m_h (j - i),

and a zero-padded key (before the sequence) has all-zero columns, exactly like the zero score the
materialised convolution reads there. Cost: two more columns of QK^T. The columns hold absolute
positions: exact in float32/float64 (positions < 2^24); under bfloat16 autocast they round
(integers above 256), so the bias is then approximate. A bias that is not bilinear in (i, j)
(T5's buckets, the bidirectional ``-m |i - j|``) cannot be folded this way.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.model.positions import alibi_slopes


def alibi_columns(q: Tensor, k: Tensor, scale: float, offset: int) -> tuple[Tensor, Tensor]:
    """q [B, H, Tq, d] at positions offset + i, k [B, H_kv, Tk, d] at positions j ->
    ([B, H, Tq, d + 2], [B, H_kv, Tk, d + 2]) whose scaled dot products carry ALiBi's bias."""
    B, H, Tq, _ = q.shape
    Tk = k.shape[2]
    m = alibi_slopes(H).to(device=q.device, dtype=q.dtype) / scale
    pos = torch.arange(offset, offset + Tq, device=q.device, dtype=q.dtype)
    qa = torch.stack([m[:, None].expand(H, Tq), -m[:, None] * pos[None, :]], dim=-1)
    j = torch.arange(Tk, device=k.device, dtype=k.dtype)
    ka = torch.stack([j, torch.ones_like(j)], dim=-1)
    qa = qa.expand(B, H, Tq, 2)
    ka = ka.expand(B, k.shape[1], Tk, 2)
    return torch.cat([q, qa], dim=-1), torch.cat([k, ka], dim=-1)
