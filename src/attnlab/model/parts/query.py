"""How the query is formed from u = Norm(x) (or the pre-projected x~). SPEC 1.1, seeds 001/002.

- linear:    q = u W_Q                                       params d*d_q
- identity:  q = u                                           params 0 (needs d_q == d)
- nonlinear: q = (u + f(u)) / 2,  f(u) = LN(act(RMSNorm(u) W1) W2),  W1: d x r, W2: r x d
             params 2dr (= d^2 at r = d/2) + O(d) norms; FLOPs 4dr/token, as W_Q's 2d^2.
- anchored:  q = u W_Q + f(u) (or (u W_Q + f(u)) / 2), f's final LN affine zero-initialised so a
             pretrained W_Q is unchanged at step 0.                        params d*d_q + 2dr + O(d)

Each kind can join the fused K, V matmul: ``fused_weights()`` gives its rows (and bias) and
``finish(u, part)`` turns its slice of the product into q; ``forward(u)`` is the plain unfused
computation. Fused nonlinear path: RMSNorm(u) W1 = s(u) * (u (diag(g) W1)) with
s(u) = rsqrt(mean(u^2) + eps), so W1 joins W_K and W_V in one d -> 2 d_kv + r matmul and the
per-token scalar s is applied after.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from attnlab.base.schema import Activation
from attnlab.model.activations import make_activation
from attnlab.model.linear import Linear
from attnlab.model.norms import LayerNorm, RMSNorm
from attnlab.parts import Dims, FusedRows, Init, PartOptions, QueryPart, register
from attnlab.parts.tp import TPPlan


class Bottleneck(torch.nn.Module):
    """f(u) = LN(act(RMSNorm(u) W1) W2), W1: d x r, W2: r x d_q."""

    def __init__(
        self, d: int, d_q: int, r: int, activation: str, bias: bool, norm_bias: bool, eps: float
    ) -> None:
        super().__init__()
        self.rms = RMSNorm(d, eps=eps)
        self.w1 = Linear(d, r, bias=bias)
        self.act = make_activation(activation)
        self.w2 = Linear(r, d_q, bias=bias)
        self.ln = LayerNorm(d_q, bias=norm_bias, eps=eps)

    def hidden(self, u: Tensor) -> Tensor:
        return self.w1(self.rms(u))

    def fused_weight(self) -> tuple[Tensor, Tensor | None]:
        """Rows of diag(g) W1 for the fused matmul (W1's bias is added after the RMS scale)."""
        return self.w1.weight * self.rms.weight[None, :], None

    def hidden_from_fused(self, u: Tensor, part: Tensor) -> Tensor:
        uf = u if u.dtype in (torch.float32, torch.float64) else u.float()
        s = torch.rsqrt(uf.pow(2).mean(-1, keepdim=True) + self.rms.eps).to(part.dtype)
        h = part * s
        return h + self.w1.bias if self.w1.bias is not None else h

    def out(self, h: Tensor) -> Tensor:
        return self.ln(self.w2(self.act(h)))

    def forward(self, u: Tensor) -> Tensor:
        return self.out(self.hidden(u))


def _anchored_to_u(name: str, model) -> list[str]:
    hd, H = model.head_dim, model.attention.n_heads
    if H * hd == model.d_model:
        return []
    return [
        f"model.query.kind='{name}' needs d_model == n_heads * head_dim "
        f"({model.d_model} != {H}*{hd}); q = Norm(x) has width d_model"
    ]


def bottleneck_params(d: int, d_q: int, r: int, dims: Dims) -> int:
    """Parameters of :class:`Bottleneck`: RMSNorm d, W1 d r (+ r), W2 r d_q (+ d_q), LN d_q (+ d_q)."""
    bias = r + d_q if dims.bias else 0
    return d + d * r + r * d_q + bias + d_q * (2 if dims.norm_bias else 1)


class BottleneckOptions(PartOptions):
    ratio: float = Field(0.5, gt=0, description="r = ratio * d for the bottleneck f")
    activation: Activation = "gelu"

    def width(self, d: int) -> int:
        return max(1, int(round(self.ratio * d)))


@register("query", "linear")
class LinearQuery(QueryPart):
    """q = u W_Q (+ b)."""

    cost = "params d*d_q; FLOPs 2*d*d_q per token"

    @classmethod
    def param_count(cls, opts: PartOptions, dims: Dims) -> int:
        return dims.d_model * dims.d_q + (dims.d_q if dims.bias else 0)

    def __init__(self, opts: PartOptions, dims: Dims) -> None:
        super().__init__(opts, dims)
        self.w_q = Linear(dims.d_model, dims.d_q, bias=dims.bias)

    def fused_weights(self) -> FusedRows:
        return [(self.w_q.weight, self.w_q.bias)]

    def tp_plan(self) -> TPPlan:
        return TPPlan(linears={"w_q": "colwise"})  # rank r: its heads' rows of W_Q

    def forward(self, u: Tensor) -> Tensor:
        return self.w_q(u)


@register("query", "identity")
class IdentityQuery(QueryPart):
    """q = u: W_Q fixed to I (Karbevski & Mijoski 2025)."""

    cost = "params 0; FLOPs 0 (needs d_q == d)"

    class Options(PartOptions):
        def check(self, model) -> list[str]:
            return _anchored_to_u("identity", model)

    @classmethod
    def param_count(cls, opts: PartOptions, dims: Dims) -> int:
        return 0

    def fused_weights(self) -> FusedRows:
        return []

    def tp_plan(self) -> TPPlan:
        return TPPlan.whole("q = u has no weight to split; each rank keeps its heads' columns")

    def finish(self, u: Tensor, part: Tensor) -> Tensor:
        return u

    def forward(self, u: Tensor) -> Tensor:
        return u


@register("query", "nonlinear")
class NonlinearQuery(QueryPart):
    """q = (u + f(u)) / 2 (seed 001). With ``scale_form`` q = u + f(u) and the softmax scale is
    halved instead, which equals the explicit /2 only while q enters the logits linearly."""

    cost = "params 2*d*r + O(d) (r = ratio*d; = d^2 at r = d/2); FLOPs 4*d*r per token"

    class Options(BottleneckOptions):
        scale_form: bool = Field(
            False, description="realise the /2 by halving the softmax scale (authors' form)"
        )

        def check(self, model) -> list[str]:
            out = _anchored_to_u("nonlinear", model)
            if self.scale_form and model.attention.qk_norm:
                out.append(
                    "model.query.scale_form (halving the softmax scale) equals the explicit /2 "
                    "only while q enters the logits linearly; with model.attention.qk_norm it "
                    "does not. Set model.query.scale_form=false"
                )
            return out

    @classmethod
    def param_count(cls, opts: Options, dims: Dims) -> int:
        d = dims.d_model
        return bottleneck_params(d, d, opts.width(d), dims)

    def __init__(self, opts: Options, dims: Dims) -> None:
        super().__init__(opts, dims)
        d = dims.d_model
        r = opts.width(d)
        self.f = Bottleneck(d, d, r, opts.activation, dims.bias, dims.norm_bias, dims.norm_eps)
        self.scale_form = opts.scale_form
        self.scale_multiplier = 0.5 if self.scale_form else 1.0

    def _combine(self, u: Tensor, f: Tensor) -> Tensor:
        return u + f if self.scale_form else (u + f) * 0.5

    def fused_weights(self) -> FusedRows:
        return [self.f.fused_weight()]

    def tp_plan(self) -> TPPlan:
        return TPPlan.whole("f(u) ends in a LayerNorm over all d columns of q, across heads")

    def finish(self, u: Tensor, part: Tensor) -> Tensor:
        return self._combine(u, self.f.out(self.f.hidden_from_fused(u, part)))

    def forward(self, u: Tensor) -> Tensor:
        return self._combine(u, self.f(u))


@register("query", "anchored")
class AnchoredQuery(QueryPart):
    """q = u W_Q + f(u) with f's final LN affine at zero (unchanged at init), or with ``mean``
    (u W_Q + f(u)) / 2. On a pretrained model W_Q is the base's own and only f is trained."""

    cost = "params d*d_q + 2*d*r + O(d) (pretrained: 2*d*r + O(d)); FLOPs 2*d*d_q + 4*d*r"
    probe_name = "anchored-query"

    class Options(BottleneckOptions):
        mean: bool = Field(
            False, description="(u W_Q + f)/2: halves q, so a pretrained base is NOT unchanged"
        )
        init_std: float | None = Field(
            None, ge=0, description="W1, W2 init std; None = the model's init std"
        )

    @classmethod
    def param_count(cls, opts: Options, dims: Dims) -> int:
        d, d_q = dims.d_model, dims.d_q
        w_q = 0 if dims.pretrained else d * d_q + (d_q if dims.bias else 0)
        return w_q + bottleneck_params(d, d_q, opts.width(d), dims)

    def __init__(self, opts: Options, dims: Dims) -> None:
        super().__init__(opts, dims)
        d, d_q = dims.d_model, dims.d_q
        r = opts.width(d)
        self.w_q = None if dims.pretrained else Linear(d, d_q, bias=dims.bias)
        self.f = Bottleneck(d, d_q, r, opts.activation, dims.bias, dims.norm_bias, dims.norm_eps)
        self.mean = opts.mean
        self.d_q, self.r = d_q, r

    def init_weights(self, init: Init) -> None:
        std = self.opts.init_std
        super().init_weights(init if std is None else Init(std, std))
        with torch.no_grad():
            self.f.ln.weight.zero_()  # f = 0 at step 0: q is the (pretrained) u W_Q

    def _combine(self, lin: Tensor, f: Tensor) -> Tensor:
        return (lin + f) * 0.5 if self.mean else lin + f

    def tp_plan(self) -> TPPlan:
        return TPPlan.whole("f(u) ends in a LayerNorm over all d_q columns of q, across heads")

    def fused_weights(self) -> FusedRows | None:
        if self.w_q is None:
            return None
        return [(self.w_q.weight, self.w_q.bias), self.f.fused_weight()]

    def finish(self, u: Tensor, part: Tensor) -> Tensor:
        lin, h = part.split([self.d_q, self.r], dim=-1)
        return self._combine(lin, self.f.out(self.f.hidden_from_fused(u, h)))

    def forward(self, u: Tensor) -> Tensor:
        assert self.w_q is not None, "a pretrained-mode anchored query adds to the base's q"
        return self._combine(self.w_q(u), self.f(u))

    def pretrained_delta(self, u: Tensor, q_base: Tensor) -> Tensor:
        f = self.f(u)
        return 0.5 * (f - q_base) if self.mean else f
