"""Pre-projection (seed 000): x~ = x^ + W_down act(W_up x^), before Q, K and V.

W_up: d -> e*d, W_down: e*d -> d (e = 1.25, act SiLU), no bias, both N(0, 0.01) so x~ ~= x^ at
init. Params 2*e*d^2 per layer (17.69M on Pythia-160M, 62.91M on 410M); FLOPs 4*e*d^2 per token.
Gated form: x~ = x^ + W_down (act(x^ W_gate) * x^ W_up), params 3*e*d^2. No K/V-cache cost: the
cached keys and values keep the baseline's shape.
"""

from __future__ import annotations

from pydantic import Field
from torch import Tensor, nn

from attnlab.base.schema import Activation
from attnlab.model.activations import make_activation
from attnlab.model.linear import Linear
from attnlab.parts import Dims, FeatureMapPart, Init, PartOptions, register
from attnlab.parts.tp import TPPlan


@register("feature_map", "pre_projection")
class PreProjection(FeatureMapPart):
    """x~ = x^ + W_down act(W_up x^) (or its gated form)."""

    param_label = "pre_projection"
    cost = "params 2*e*d^2 (gated 3*e*d^2); FLOPs 4*e*d^2 (gated 6*e*d^2) per token; cache 0"
    probe_name = "preproj"

    class Options(PartOptions):
        expansion: float = Field(1.25, gt=0, description="hidden width e * d")
        activation: Activation = "silu"
        gated: bool = False
        init_std: float = Field(0.01, ge=0, description="N(0, std) for W_up, W_gate, W_down")

        def check(self, model) -> list[str]:
            if int(round(self.expansion * model.d_model)) < 1:
                return [
                    f"model.feature_map.expansion={self.expansion} gives a hidden width of 0 at "
                    f"d_model={model.d_model}; raise it"
                ]
            return []

    @classmethod
    def param_count(cls, opts: Options, dims: Dims) -> int:
        d = dims.d_model
        return (3 if opts.gated else 2) * d * int(round(opts.expansion * d))

    def __init__(self, opts: Options, dims: Dims) -> None:
        super().__init__(opts, dims)
        d = dims.d_model
        hidden = int(round(opts.expansion * d))
        self.w_up = Linear(d, hidden, bias=False)
        self.w_gate = Linear(d, hidden, bias=False) if opts.gated else None
        self.act = make_activation(opts.activation)
        self.w_down = Linear(hidden, d, bias=False)

    def init_weights(self, init: Init) -> None:
        for lin in (self.w_up, self.w_gate, self.w_down):
            if lin is not None:
                nn.init.normal_(lin.weight, 0.0, self.opts.init_std)

    def tp_plan(self) -> TPPlan:
        # rank r: e d / P hidden units (W_up, W_gate rows; W_down columns), one all-reduce
        linears = {"w_up": "colwise", "w_down": "rowwise"}
        return TPPlan(linears={**linears, "w_gate": "colwise"} if self.w_gate else linears)

    def forward(self, x_hat: Tensor) -> Tensor:
        if self.w_gate is not None:
            h = self.act(self.w_gate(x_hat)) * self.w_up(x_hat)
        else:
            h = self.act(self.w_up(x_hat))
        return x_hat + self.w_down(h)
