"""Positional schemes. Three ways in, so each kind touches only what it must:

- absolute (learned, sinusoidal): a [T, d] table added to the token embeddings;
- rotary (RoPE, Su et al. 2021): rotates q and k per head, on the first ``fraction`` of each
  head's dims (GPT-NeoX/Pythia rotate 25%), rotate-half layout as in GPT-NeoX and Llama;
- logit bias (ALiBi, Press et al. 2022; T5 relative buckets, Raffel et al. 2020): a [H, Tq, Tk]
  term added to the attention logits.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class LearnedPositions(nn.Module):
    """p_t = E_pos[t], params max_len * d."""

    def __init__(self, max_len: int, d: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.table = nn.Embedding(max_len, d)

    def forward(self, positions: Tensor) -> Tensor:
        return self.table(positions)


class SinusoidalPositions(nn.Module):
    """p_(t,2i) = s * sin(t / 10000^(2i/d)), p_(t,2i+1) = s * cos(...) (Vaswani et al. 2017); no
    params. The scale s sets the signal's per-dimension RMS (s / sqrt(2)) against the token
    embeddings': with s = sqrt(2) * init_std both start at the same size, the role Vaswani's
    sqrt(d) embedding multiplier plays; s = 1 is the textbook table."""

    def __init__(self, d: int, base: float = 10000.0, scale: float = 1.0) -> None:
        super().__init__()
        self.d, self.base, self.scale = d, base, scale

    def forward(self, positions: Tensor) -> Tensor:
        # computed in float32 on the fly: a buffer would be rounded by model.to(bfloat16)
        inv = self.base ** (
            -torch.arange(0, self.d, 2, dtype=torch.float32, device=positions.device) / self.d
        )
        ang = positions.float()[:, None] * inv[None, :]
        out = torch.zeros(positions.shape[0], self.d, device=positions.device)
        out[:, 0::2] = torch.sin(ang)
        out[:, 1::2] = torch.cos(ang)[:, : self.d // 2]
        return out * self.scale


class Rotary(nn.Module):
    """RoPE on the first ``rot`` dims of each head: x' = x cos(t w) + rotate_half(x) sin(t w).

    <R_s q, R_t k> depends on t - s only. No params; O(T * rot) FLOPs per head.
    """

    def __init__(self, head_dim: int, fraction: float = 1.0, base: float = 10000.0) -> None:
        super().__init__()
        self.rot, self.base = int(head_dim * fraction), base

    def cos_sin(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos/sin tables [T, rot] in ``dtype``, computed in float32 (never from rounded buffers)."""
        idx = torch.arange(0, self.rot, 2, dtype=torch.float32, device=positions.device)
        inv = self.base ** (-idx / self.rot)
        ang = positions.float()[:, None] * inv[None, :]
        ang = torch.cat([ang, ang], dim=-1)
        return ang.cos().to(dtype), ang.sin().to(dtype)

    def apply(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """x: [B, H, T, head_dim]; cos/sin: [T, rot]."""
        r = self.rot
        xr, xp = x[..., :r], x[..., r:]
        x1, x2 = xr.chunk(2, dim=-1)
        rotated = torch.cat([-x2, x1], dim=-1)
        out = xr * cos + rotated * sin
        return torch.cat([out, xp], dim=-1) if xp.shape[-1] else out


def alibi_slopes(n_heads: int) -> Tensor:
    """Head slopes m_h: the geometric sequence 2^(-8h/n) for a power-of-two n, and for other n the
    closest lower power of two interleaved with every other slope of the next one (Press et al.)."""

    def pow2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n_heads).is_integer():
        return torch.tensor(pow2(n_heads))
    closest = 2 ** math.floor(math.log2(n_heads))
    extra = pow2(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(pow2(closest) + extra)


class ALiBi(nn.Module):
    """bias[h, i, j] = -m_h * |i - j| (causal models only see j <= i). No params."""

    def __init__(self, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads

    def forward(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        dist = (q_pos[:, None] - k_pos[None, :]).abs().float()
        slopes = alibi_slopes(self.n_heads).to(q_pos.device)
        return -slopes[:, None, None] * dist[None]


class T5RelativeBias(nn.Module):
    """bias[h, i, j] = B[bucket(j - i), h]: exact buckets for small offsets, log-spaced up to
    ``max_distance``; separate buckets for the two directions when bidirectional. Params buckets*H,
    shared by all layers of a stack."""

    def __init__(
        self, n_heads: int, buckets: int = 32, max_distance: int = 128, bidirectional: bool = False
    ) -> None:
        super().__init__()
        self.buckets, self.max_distance, self.bidirectional = buckets, max_distance, bidirectional
        self.table = nn.Embedding(buckets, n_heads)

    def bucket(self, rel: Tensor) -> Tensor:
        n, out = self.buckets, torch.zeros_like(rel)
        if self.bidirectional:
            n //= 2
            out = out + (rel > 0).long() * n
            rel = rel.abs()
        else:
            rel = (-rel).clamp_min(0)
        exact = n // 2
        is_small = rel < exact
        large = (
            exact
            + (
                torch.log(rel.float().clamp_min(1) / exact)
                / math.log(self.max_distance / exact)
                * (n - exact)
            ).long()
        )
        large = large.clamp_max(n - 1)
        return out + torch.where(is_small, rel, large)

    def forward(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        rel = k_pos[None, :] - q_pos[:, None]
        return self.table(self.bucket(rel)).permute(2, 0, 1)
