"""Pre-projection (seed 000): x~ = x^ + W_down act(W_up x^), before Q, K and V.

W_up: d -> e*d, W_down: e*d -> d (e = 1.25, act SiLU), no bias, both N(0, 0.01) so x~ ~= x^ at
init. Params 2*e*d^2 per layer (17.69M on Pythia-160M, 62.91M on 410M); FLOPs 4*e*d^2 per token.
Gated form: x~ = x^ + W_down (act(x^ W_gate) * x^ W_up), params 3*e*d^2. No K/V-cache cost: the
cached keys and values keep the baseline's shape.
"""

from __future__ import annotations

from torch import Tensor, nn

from attnlab.config import PreProjectionConfig
from attnlab.model.activations import make_activation
from attnlab.model.linear import Linear


class PreProjection(nn.Module):
    """x~ = x^ + W_down act(W_up x^) (or its gated form)."""

    def __init__(self, d: int, cfg: PreProjectionConfig) -> None:
        super().__init__()
        hidden = int(round(cfg.expansion * d))
        self.gated = cfg.gated
        self.w_up = Linear(d, hidden, bias=False)
        self.w_gate = Linear(d, hidden, bias=False) if cfg.gated else None
        self.act = make_activation(cfg.activation)
        self.w_down = Linear(hidden, d, bias=False)
        for lin in (self.w_up, self.w_gate, self.w_down):
            if lin is not None:
                lin.init_std = cfg.init_std

    def forward(self, x_hat: Tensor) -> Tensor:
        if self.w_gate is not None:
            h = self.act(self.w_gate(x_hat)) * self.w_up(x_hat)
        else:
            h = self.act(self.w_up(x_hat))
        return x_hat + self.w_down(h)
