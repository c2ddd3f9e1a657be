"""A score part: a learned temperature per head; --plugin examples/score_temperature.py.

s'_h = s_h / tau_h with tau_h = exp(theta_h) learned per head (theta_h = log ``init``): a head may
sharpen or flatten its own attention. It declares a score_mod (FlexAttention's convention) and
the exact fold the attention engine may use instead of calling it per entry: a per-head scale
(``kind = "scale"``), which the engine multiplies into q, so the layer stays on fused SDPA (no
T x T matrix). The battery's "fused" property proves the fold equals the score_mod.

    [model.score]
    kind = "temperature"
    init = 1.0

params H per layer; FLOPs 0 beyond attention (one multiply of q per head).
"""

import math

import torch
from torch import nn

from attnlab.model.engine import ScoreMod
from attnlab.parts import Field, ScorePart, register


class HeadTemperature(ScoreMod):
    """score_mod(s, b, h, i, j) = s * exp(-theta_h); declared kind = "scale". It reads its
    part's parameter at each call (a loaded or moved model replaces the tensor)."""

    kind = "scale"

    def __init__(self, part: nn.Module) -> None:
        self.part = part

    def __repr__(self) -> str:
        return "HeadTemperature()"

    def parameters(self):
        return [self.part.theta]

    def head_scale(self):
        return torch.exp(-self.part.theta)

    def score_mod(self, score, b, h, q_idx, kv_idx):
        return score * torch.exp(-self.part.theta).to(score.dtype)[h]


@register("score", "temperature")
class Temperature(ScorePart):
    """A learned softmax temperature per head, folded into q."""

    cost = "params H; FLOPs 0 beyond attention"

    class Options(ScorePart.Options):
        init: float = Field(1.0, gt=0, description="tau at initialisation")

    @classmethod
    def param_count(cls, opts, dims):
        return dims.n_heads

    def __init__(self, opts, dims):
        super().__init__(opts, dims)
        self.theta = nn.Parameter(torch.full((dims.n_heads,), math.log(opts.init)))
        self._mods = (HeadTemperature(self),)

    def init_weights(self, init):
        with torch.no_grad():
            self.theta.fill_(math.log(self.opts.init))

    def no_decay_parameters(self):
        return [self.theta]

    def score_mods(self):
        return self._mods
