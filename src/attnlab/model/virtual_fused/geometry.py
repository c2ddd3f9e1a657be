"""Taps, head groups and shifts of a virtual-head convolution.

Heads mix in ``n_groups = H / G`` groups of G heads (G = 1: per head; G = H: across all heads);
each group makes ``V = H' / n_groups`` virtual heads, so virtual head ``h' = g V + v`` reads heads
``g G + l``, l < G, with the compact weight ``w[h', l, ...]``. A tap (a, b) reads the score at
query offset ``alpha[a]`` and key offset ``beta[b]``:

- 1-D (causal along the key axis): ``w [H', G, K]``, alpha = (0,), beta_t = -t;
- 2-D (same-padded, as ``F.conv2d``): ``w [H', G, K, K]``, alpha_a = a - K // 2,
  beta_b = b - K // 2.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Geometry:
    """Head counts and taps of one virtual-head part (``H`` query heads, ``H_kv`` K/V heads,
    ``H_out = H'`` virtual heads, groups of ``G`` heads, kernel ``K``)."""

    H: int
    H_kv: int
    H_out: int
    G: int
    K: int
    conv: str  # "1d" | "2d"

    @property
    def n_groups(self) -> int:
        return self.H // self.G

    @property
    def V(self) -> int:  # noqa: N802 (the symbol of the docs)
        """Virtual heads per group."""
        return self.H_out // self.n_groups

    @property
    def alphas(self) -> list[int]:
        """Query offsets of the taps."""
        return [0] if self.conv == "1d" else [a - self.K // 2 for a in range(self.K)]

    @property
    def betas(self) -> list[int]:
        """Key offsets of the taps."""
        if self.conv == "1d":
            return [-t for t in range(self.K)]
        return [b - self.K // 2 for b in range(self.K)]

    def weight_shape(self) -> tuple[int, ...]:
        return (self.H_out, self.G, *([self.K] * (1 if self.conv == "1d" else 2)))

    def taps(self, w: Tensor) -> Tensor:
        """The compact weight as [n_groups, V, G, n_alpha, n_beta]."""
        w4 = w[:, :, None, :] if self.conv == "1d" else w
        return w4.reshape(self.n_groups, self.V, self.G, *w4.shape[2:])

    def dense(self, w: Tensor) -> Tensor:
        """The compact weight as the materialised form's [H', H, K] or [H', H, K, K] (zero
        outside each virtual head's group); differentiable."""
        group = torch.arange(self.H_out, device=w.device) // self.V
        onehot = (group[:, None] == torch.arange(self.n_groups, device=w.device)).to(w.dtype)
        tail = [1] * (w.dim() - 1)
        dense = onehot.view(self.H_out, self.n_groups, *tail) * w.unsqueeze(1)
        return dense.reshape(self.H_out, self.H, *w.shape[2:])

    def value_heads(self, v: Tensor) -> Tensor:
        """[B, H_kv, T, d] -> [B, H', T, d]: the K/V group each virtual head reads values from."""
        return repeat_heads(v, self.H_out)


def repeat_heads(x: Tensor, n: int) -> Tensor:
    """[B, h, T, d] -> [B, n, T, d], each head repeated n / h times in place (GQA order)."""
    h = x.shape[1]
    return x if h == n else x.repeat_interleave(n // h, dim=1)


def shifts(x: Tensor, offsets: list[int], dim: int = -2) -> list[Tensor]:
    """``[shift(x, d, dim) for d in offsets]`` as views of one zero-padded copy of ``x``."""
    dim = dim % x.dim()
    lo, hi = max(0, -min(offsets)), max(0, max(offsets))
    if lo == hi == 0:
        return [x for _ in offsets]
    T = x.shape[dim]
    shape = list(x.shape)
    parts = [x.new_zeros(*shape[:dim], lo, *shape[dim + 1 :])] if lo else []
    parts.append(x)
    if hi:
        parts.append(x.new_zeros(*shape[:dim], hi, *shape[dim + 1 :]))
    padded = torch.cat(parts, dim=dim)
    return [padded.narrow(dim, lo + d, T) for d in offsets]


def shift(x: Tensor, d: int, dim: int = -2) -> Tensor:
    """``y[n] = x[n + d]`` along ``dim``, zero where n + d falls outside the sequence."""
    if d == 0:
        return x
    T = x.shape[dim]
    if abs(d) >= T:
        return torch.zeros_like(x)
    zeros = x.new_zeros(*x.shape[: dim % x.dim()], abs(d), *x.shape[dim % x.dim() + 1 :])
    if d > 0:
        return torch.cat([x.narrow(dim, d, T - d), zeros], dim=dim)
    return torch.cat([zeros, x.narrow(dim, 0, T + d)], dim=dim)
