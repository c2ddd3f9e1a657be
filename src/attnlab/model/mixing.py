"""Head mixing: concatenated head outputs [.., n_in] -> d.

- linear:    o W_O                                   params n_in * d (+ d)
- nonlinear: W_b act(W_a o) (seed 004): an MLP whose hidden width m is chosen so that its params
  equal W_O's plus those of the MLP blocks removed from the layer:
  m = (n_in*d + P_mlp) / (n_in + d) (biases included when the model has them), P_mlp = the
  removed FFN block's params with its norm. FLOPs 2m(n_in + d)/token.
"""

from __future__ import annotations

from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.model.activations import make_activation
from attnlab.model.linear import Linear


def removed_mlp_params(cfg: ModelConfig) -> int:
    """Parameters of one FFN block and its norm (what ``mlp = false`` removes per layer)."""
    d, h = cfg.d_model, cfg.ffn_hidden
    glu = cfg.ffn.kind in ("swiglu", "geglu")
    mats = (3 if glu else 2) * d * h
    biases = ((2 * h if glu else h) + d) if cfg.bias else 0
    norm = {"layernorm": d * (2 if cfg.norm.bias else 1), "rmsnorm": d, "scalenorm": 1}
    return mats + biases + norm[cfg.norm.kind]


def nonlinear_mixer_hidden(cfg: ModelConfig, n_in: int) -> int:
    """Hidden width m of the nonlinear mixer: its params m(n_in + d) (+ m + d biases) match a
    linear W_O plus the removed MLP block as closely as a whole width allows."""
    if cfg.mixer.hidden is not None:
        return cfg.mixer.hidden
    d, b = cfg.d_model, int(cfg.bias)
    target = n_in * d + b * d + removed_mlp_params(cfg)
    return max(1, round((target - b * d) / (n_in + d + b)))


class NonlinearMixer(nn.Module):
    """o -> W_b act(W_a o)."""

    def __init__(self, n_in: int, d: int, hidden: int, activation: str, bias: bool) -> None:
        super().__init__()
        self.w_a = Linear(n_in, hidden, bias=bias)
        self.act = make_activation(activation)
        self.w_b = Linear(hidden, d, bias=bias)
        self.w_b.is_output_projection = True

    def forward(self, o: Tensor) -> Tensor:
        return self.w_b(self.act(self.w_a(o)))


def make_mixer(cfg: ModelConfig, n_in: int) -> nn.Module:
    if cfg.mixer.nonlinear:
        hidden = nonlinear_mixer_hidden(cfg, n_in)
        return NonlinearMixer(n_in, cfg.d_model, hidden, cfg.mixer.activation, cfg.bias)
    lin = Linear(n_in, cfg.d_model, bias=cfg.bias)
    lin.is_output_projection = True
    return lin
