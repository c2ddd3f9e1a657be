"""RMSNorm (Zhang & Sennrich 2019) as the stack's norm: g * x / sqrt(mean(x^2) + eps).

Params d (never a bias: ``bias`` is ignored); O(d) elementwise work per token. Init: gain 1.
"""

from __future__ import annotations

import torch
from torch import nn

from attnlab.model.norms import RMSNorm
from attnlab.parts import Dims, NormPart, register


@register("norm", "rmsnorm")
class RMSNormPart(NormPart):
    """Root-mean-square normalisation over the last dimension, with a gain."""

    cost = "params d; FLOPs 0 (elementwise)"

    @classmethod
    def param_count(cls, opts: NormPart.Options, dims: Dims) -> int:
        return dims.d_model

    def __init__(self, opts: NormPart.Options, dims: Dims) -> None:
        super().__init__(opts, dims)
        self.eps = opts.eps
        self.weight = nn.Parameter(torch.ones(dims.d_model))

    reset_norm = RMSNorm.reset_norm
    forward = RMSNorm.forward
