"""LayerNorm (Ba et al. 2016) as the stack's norm: g * (x - mean) / sqrt(var + eps) + b.

Params d (+ d with ``bias``; nanoGPT runs GPT-2 without it); O(d) elementwise work per token,
no matmul FLOPs. Init: gain 1, bias 0.
"""

from __future__ import annotations

import torch
from torch import nn

from attnlab.model.norms import LayerNorm
from attnlab.parts import Dims, NormPart, register


@register("norm", "layernorm")
class LayerNormPart(NormPart):
    """Mean-and-variance normalisation over the last dimension, with a gain and a bias."""

    cost = "params d (2d with bias); FLOPs 0 (elementwise)"

    @classmethod
    def param_count(cls, opts: NormPart.Options, dims: Dims) -> int:
        return dims.d_model * (2 if opts.bias else 1)

    def __init__(self, opts: NormPart.Options, dims: Dims) -> None:
        super().__init__(opts, dims)
        self.eps = opts.eps
        self.weight = nn.Parameter(torch.ones(dims.d_model))
        self.bias = nn.Parameter(torch.zeros(dims.d_model)) if opts.bias else None

    reset_norm = LayerNorm.reset_norm
    forward = LayerNorm.forward
