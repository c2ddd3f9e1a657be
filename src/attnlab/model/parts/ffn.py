"""Position-wise feed-forward networks.

- MLP (gelu, relu, relu2): act(x W_in) W_out, hidden h: params 2dh (+h+d bias), FLOPs 4dh/token
- GLU (swiglu, geglu):     (act(x W_gate) * x W_in) W_out (Shazeer 2020): params 3dh, FLOPs 6dh/token
W_out is the branch's output projection, initialised N(0, out_std).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor

from attnlab.model.activations import make_activation
from attnlab.model.linear import Linear
from attnlab.parts import Dims, FFNPart, Init, PartOptions, register
from attnlab.parts.part import default_init
from attnlab.parts.tp import TPPlan, is_split, shard_range, summed_grad


class FFNOptions(PartOptions):
    """Width of a feed-forward block: ``hidden``, else ``ratio * d_model``."""

    ratio: float = Field(4.0, gt=0, description="hidden = ratio * d_model unless hidden is set")
    hidden: int | None = Field(None, ge=1)

    def width(self, d_model: int) -> int:
        return self.hidden or int(round(self.ratio * d_model))

    def check(self, model) -> list[str]:
        if model.mlp and self.width(model.d_model) < 1:
            return [
                f"model.ffn.ratio={self.ratio} gives a hidden width of 0 at d_model="
                f"{model.d_model}; raise model.ffn.ratio, set model.ffn.hidden, or model.mlp=false"
            ]
        return []


class MLP(FFNPart):
    """act(x W_in + b) W_out + b."""

    cost = "params 2*d*h (+ h + d); FLOPs 4*d*h per token"
    Options = FFNOptions
    width_option = "hidden"
    activation = "gelu"

    @classmethod
    def param_count(cls, opts: FFNOptions, dims: Dims) -> int:
        d, h = dims.d_model, opts.width(dims.d_model)
        return 2 * d * h + (h + d if dims.bias else 0)

    def __init__(self, opts: FFNOptions, dims: Dims) -> None:
        super().__init__(opts, dims)
        h = opts.width(dims.d_model)
        self.w_in = Linear(dims.d_model, h, bias=dims.bias)
        self.act = make_activation(self.activation)
        self.w_out = Linear(h, dims.d_model, bias=dims.bias)

    def init_weights(self, init: Init) -> None:
        default_init(self.w_in, init.std)
        default_init(self.w_out, init.out_std)

    def tp_plan(self) -> TPPlan:
        # rank r: h/P hidden units (W_in's rows, W_out's columns); one all-reduce of the output
        return TPPlan(linears={"w_in": "colwise", "w_out": "rowwise"})

    def forward(self, x: Tensor) -> Tensor:
        return self.w_out(self.act(self.w_in(x)))


@register("ffn", "gelu")
class GeluMLP(MLP):
    """GELU(x W_in) W_out."""


@register("ffn", "relu")
class ReluMLP(MLP):
    """ReLU(x W_in) W_out."""

    activation = "relu"


@register("ffn", "relu2")
class Relu2MLP(MLP):
    """ReLU(x W_in)^2 W_out (Primer)."""

    activation = "relu2"


class GLU(FFNPart):
    """(act(x W_gate) * (x W_in)) W_out, the gate and input computed by one fused matmul."""

    cost = "params 3*d*h (+ 2h + d); FLOPs 6*d*h per token"
    Options = FFNOptions
    width_option = "hidden"
    activation = "silu"

    @classmethod
    def param_count(cls, opts: FFNOptions, dims: Dims) -> int:
        d, h = dims.d_model, opts.width(dims.d_model)
        return 3 * d * h + (2 * h + d if dims.bias else 0)

    def __init__(self, opts: FFNOptions, dims: Dims) -> None:
        super().__init__(opts, dims)
        self.hidden = h = opts.width(dims.d_model)
        self.w_gate_in = Linear(dims.d_model, 2 * h, bias=dims.bias)
        self.act = make_activation(self.activation)
        self.w_out = Linear(h, dims.d_model, bias=dims.bias)

    def init_weights(self, init: Init) -> None:
        default_init(self.w_gate_in, init.std)
        default_init(self.w_out, init.out_std)

    def tp_plan(self) -> TPPlan:
        """Rank r runs its h/P hidden units: W_out's columns split (rowwise, one all-reduce);
        [W_gate; W_in] stays whole on every rank (a row split would give a rank gates without
        their inputs), each rank multiplying by its units' rows of both, their gradient summed."""
        summed = tuple(n for n, _ in self.w_gate_in.named_parameters(prefix="w_gate_in"))
        return TPPlan(linears={"w_out": "rowwise"}, summed=summed)

    def forward(self, x: Tensor) -> Tensor:
        if is_split(self.w_out.weight):
            return self._split_forward(x)
        gate, inp = self.w_gate_in(x).split(self.hidden, dim=-1)
        return self.w_out(self.act(gate) * inp)

    def _split_forward(self, x: Tensor) -> Tensor:
        """This rank's hidden units [lo, hi): rows lo..hi of W_gate and of W_in, the input's and
        [W_gate; W_in]'s gradients summed over the ranks."""
        like, h = self.w_out.weight, self.hidden
        lo, hi = shard_range(like)
        w = summed_grad(self.w_gate_in.weight, like)
        rows = torch.cat([w[lo:hi], w[h + lo : h + hi]])
        b = self.w_gate_in.bias
        if b is not None:
            b = summed_grad(b, like)
            b = torch.cat([b[lo:hi], b[h + lo : h + hi]])
        gate, inp = F.linear(summed_grad(x, like), rows, b).split(hi - lo, dim=-1)
        return self.w_out(self.act(gate) * inp)


@register("ffn", "swiglu")
class SwiGLU(GLU):
    """(SiLU(x W_gate) * x W_in) W_out."""


@register("ffn", "geglu")
class GeGLU(GLU):
    """(GELU(x W_gate) * x W_in) W_out."""

    activation = "gelu"
