"""The baseline key and value projections: k = u W_K, v = u W_V (W_K, W_V: d x H_kv d_h).

Params d * d_kv each (+ d_kv bias); FLOPs 2 d d_kv per token each; K/V cache 2 * H_kv * d_h
elements per token per layer. Both can join the fused Q/K/V matmul.
"""

from __future__ import annotations

from torch import Tensor

from attnlab.model.linear import Linear
from attnlab.parts import Dims, FusedRows, KeyPart, PartOptions, ValuePart, register
from attnlab.parts.tp import TPPlan


@register("key", "linear")
class LinearKey(KeyPart):
    """k = u W_K (+ b)."""

    cost = "params d*d_kv; FLOPs 2*d*d_kv per token; cache H_kv*d_h per token"

    @classmethod
    def param_count(cls, opts: PartOptions, dims: Dims) -> int:
        return dims.d_model * dims.d_kv + (dims.d_kv if dims.bias else 0)

    def __init__(self, opts: PartOptions, dims: Dims) -> None:
        super().__init__(opts, dims)
        self.w_k = Linear(dims.d_model, dims.d_kv, bias=dims.bias)

    def fused_weights(self) -> FusedRows:
        return [(self.w_k.weight, self.w_k.bias)]

    def tp_plan(self) -> TPPlan:
        return TPPlan(linears={"w_k": "colwise"})  # rank r: its KV heads' rows of W_K

    def forward(self, u: Tensor) -> Tensor:
        return self.w_k(u)


@register("value", "linear")
class LinearValue(ValuePart):
    """v = u W_V (+ b)."""

    cost = "params d*d_kv; FLOPs 2*d*d_kv per token; cache H_kv*d_h per token"

    @classmethod
    def param_count(cls, opts: PartOptions, dims: Dims) -> int:
        return dims.d_model * dims.d_kv + (dims.d_kv if dims.bias else 0)

    def __init__(self, opts: PartOptions, dims: Dims) -> None:
        super().__init__(opts, dims)
        self.w_v = Linear(dims.d_model, dims.d_kv, bias=dims.bias)

    def fused_weights(self) -> FusedRows:
        return [(self.w_v.weight, self.w_v.bias)]

    def tp_plan(self) -> TPPlan:
        return TPPlan(linears={"w_v": "colwise"})  # rank r: its KV heads' rows of W_V

    def forward(self, u: Tensor) -> Tensor:
        return self.w_v(u)
