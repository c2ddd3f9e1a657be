"""Pointwise activations by name: gelu, gelu_tanh (GPT-2's tanh approximation), relu, relu2
(ReLU squared, Primer), silu."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class ReLU2(nn.Module):
    """relu(x)^2 (So et al. 2021, Primer)."""

    def forward(self, x: Tensor) -> Tensor:
        return torch.square(F.relu(x))


def make_activation(name: str) -> nn.Module:
    """The activation module for a config name."""
    if name == "gelu":
        return nn.GELU()
    if name == "gelu_tanh":
        return nn.GELU(approximate="tanh")
    if name == "relu":
        return nn.ReLU()
    if name == "relu2":
        return ReLU2()
    if name == "silu":
        return nn.SiLU()
    raise KeyError(f"unknown activation {name!r}; choose gelu, gelu_tanh, relu, relu2 or silu")
