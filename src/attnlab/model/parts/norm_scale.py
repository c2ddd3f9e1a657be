"""ScaleNorm (Nguyen & Salazar 2019) as the stack's norm: g * x / max(||x||_2, eps).

One learned scalar g, sqrt(d) at init (a unit vector scaled to the norm of a typical N(0, 1)
vector); ``bias`` is ignored. Params 1; O(d) elementwise work per token.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from attnlab.model.norms import ScaleNorm
from attnlab.parts import Dims, NormPart, register


@register("norm", "scalenorm")
class ScaleNormPart(NormPart):
    """Unit-normalise each vector, then scale it by one learned scalar."""

    cost = "params 1; FLOPs 0 (elementwise)"

    @classmethod
    def param_count(cls, opts: NormPart.Options, dims: Dims) -> int:
        return 1

    def __init__(self, opts: NormPart.Options, dims: Dims) -> None:
        super().__init__(opts, dims)
        self.eps, self.dim = opts.eps, dims.d_model
        self.weight = nn.Parameter(torch.tensor(math.sqrt(dims.d_model)))

    reset_norm = ScaleNorm.reset_norm
    forward = ScaleNorm.forward
