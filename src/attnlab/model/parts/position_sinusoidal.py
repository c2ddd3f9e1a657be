"""Sinusoidal absolute positions (Vaswani et al. 2017), added to the token embeddings:
p_(t,2i) = s sin(t / 10000^(2i/d)), p_(t,2i+1) = s cos(t / 10000^(2i/d)).

No params, no matmul FLOPs, no length limit (the table is a formula, computed in float32 for
any position). s = sqrt(2) * model.init_std gives the signal the embeddings' per-dimension RMS.
"""

from __future__ import annotations

import math

from torch import Tensor

from attnlab.model.positions import SinusoidalPositions
from attnlab.parts import Dims, Field, Init, PartOptions, PositionPart, register


@register("position", "sinusoidal")
class SinusoidalPosition(PositionPart):
    """A fixed sin/cos vector per absolute position."""

    absolute = True
    cost = "params 0; FLOPs 0; cache 0"

    class Options(PartOptions):
        base: float = Field(10000.0, gt=1, description="the wavelength base 10000")

    @classmethod
    def param_count(cls, opts: Options, dims: Dims) -> int:
        return 0

    def __init__(self, opts: Options, dims: Dims) -> None:
        super().__init__(opts, dims)
        std = dims.model.init_std if dims.model is not None else Init().std
        self.table = SinusoidalPositions(dims.d_model, opts.base, scale=math.sqrt(2) * std)

    def embed(self, positions: Tensor) -> Tensor:
        return self.table(positions)
