"""Normalisations over the last dimension (the math; the ``norm`` slot's parts in
``model/parts/norm_*.py`` use it, as do parts with norms of their own).

- LayerNorm: g * (x - mean) / sqrt(var + eps) + b          params: d (+ d bias)
- RMSNorm:   g * x / sqrt(mean(x^2) + eps)                  params: d
- ScaleNorm: g * x / max(||x||_2, eps) with a scalar g = sqrt(d) at init (Nguyen & Salazar 2019)
All cost O(d) FLOPs per token.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (nanoGPT runs GPT-2 without it)."""

    def __init__(self, dim: int, bias: bool = True, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    @torch.no_grad()
    def reset_norm(self) -> None:
        """Gain 1, bias 0: the identity map up to normalisation."""
        self.weight.fill_(1.0)
        if self.bias is not None:
            self.bias.zero_()

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """RMSNorm (Zhang & Sennrich 2019); never has a bias."""

    def __init__(self, dim: int, bias: bool = False, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    @torch.no_grad()
    def reset_norm(self) -> None:
        """Gain 1."""
        self.weight.fill_(1.0)

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


class ScaleNorm(nn.Module):
    """ScaleNorm: one learned scalar times the unit-normalised vector."""

    def __init__(self, dim: int, bias: bool = False, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps, self.dim = eps, dim
        self.weight = nn.Parameter(torch.tensor(math.sqrt(dim)))

    @torch.no_grad()
    def reset_norm(self) -> None:
        """Gain sqrt(d): a unit vector scaled to the norm of a typical N(0, 1) vector."""
        self.weight.fill_(math.sqrt(self.dim))

    def forward(self, x: Tensor) -> Tensor:
        return self.weight * x / x.norm(dim=-1, keepdim=True).clamp_min(self.eps)
