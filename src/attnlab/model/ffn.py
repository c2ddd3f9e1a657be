"""Position-wise feed-forward networks.

- MLP (gelu, relu, relu2): act(x W_in) W_out, hidden h: params 2dh (+h+d bias), FLOPs 4dh/token
- GLU (swiglu, geglu):     (act(x W_gate) * x W_in) W_out (Shazeer 2020): params 3dh, FLOPs 6dh/token
"""

from __future__ import annotations

from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.model.activations import make_activation
from attnlab.model.linear import Linear


class MLP(nn.Module):
    """act(x W_in + b) W_out + b."""

    def __init__(self, d: int, hidden: int, activation: str, bias: bool) -> None:
        super().__init__()
        self.w_in = Linear(d, hidden, bias=bias)
        self.act = make_activation(activation)
        self.w_out = Linear(hidden, d, bias=bias)
        self.w_out.is_output_projection = True

    def forward(self, x: Tensor) -> Tensor:
        return self.w_out(self.act(self.w_in(x)))


class GLU(nn.Module):
    """(act(x W_gate) * (x W_in)) W_out, the gate and input computed by one fused matmul."""

    def __init__(self, d: int, hidden: int, activation: str, bias: bool) -> None:
        super().__init__()
        self.hidden = hidden
        self.w_gate_in = Linear(d, 2 * hidden, bias=bias)
        self.act = make_activation(activation)
        self.w_out = Linear(hidden, d, bias=bias)
        self.w_out.is_output_projection = True

    def forward(self, x: Tensor) -> Tensor:
        gate, inp = self.w_gate_in(x).split(self.hidden, dim=-1)
        return self.w_out(self.act(gate) * inp)


def make_ffn(cfg: ModelConfig) -> nn.Module:
    """The configured feed-forward block of width ``cfg.ffn_hidden``."""
    kind, h = cfg.ffn.kind, cfg.ffn_hidden
    if kind in ("swiglu", "geglu"):
        return GLU(cfg.d_model, h, "silu" if kind == "swiglu" else "gelu", cfg.bias)
    return MLP(cfg.d_model, h, kind, cfg.bias)
