"""How the query is formed from u = Norm(x) (or the pre-projected x~). SPEC 1.1, seeds 001/002.

Each kind is a small part. ``fused_weights()`` gives the rows (and bias) it contributes to the one
matmul that also computes K and V (the "fused K, V, W1" path); ``finish(u, part)`` turns that
slice into q. ``forward(u)`` is the plain unfused computation, used by tests as the reference.

- linear:    q = u W_Q                                       params d*d_q
- identity:  q = u                                           params 0 (needs d_q == d)
- nonlinear: q = (u + f(u)) / 2,  f(u) = LN(act(RMSNorm(u) W1) W2),  W1: d x r, W2: r x d
             params 2dr (= d^2 at r = d/2) + O(d) norms; FLOPs 4dr/token, as W_Q's 2d^2.
- anchored:  q = u W_Q + f(u) (or (u W_Q + f(u)) / 2), f's final LN affine zero-initialised so a
             pretrained W_Q is unchanged at step 0.                        params d*d_q + 2dr + O(d)

Fused nonlinear path: RMSNorm(u) W1 = s(u) * (u (diag(g) W1)) with s(u) = rsqrt(mean(u^2) + eps), so
W1 joins W_K and W_V in one d -> 2 d_kv + r matmul and the per-token scalar s is applied after.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.model.activations import make_activation
from attnlab.model.linear import Linear
from attnlab.model.norms import LayerNorm, RMSNorm
from attnlab.model.registry import Registry

QUERIES: Registry = Registry("query kind")

FusedRows = list[tuple[Tensor, Tensor | None]]


class QueryPart(nn.Module):
    """Base: ``width`` is how many columns of the fused matmul this part reads."""

    width: int = 0
    #: the softmax-scale multiplier this part asks for (the authors' form of the /2)
    scale_multiplier: float = 1.0

    def fused_weights(self) -> FusedRows:
        return []

    def finish(self, u: Tensor, part: Tensor) -> Tensor:
        raise NotImplementedError


class Bottleneck(nn.Module):
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


@QUERIES.register("linear")
class LinearQuery(QueryPart):
    """q = u W_Q (+ b)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d_q = cfg.attention.n_heads * cfg.head_dim
        self.w_q = Linear(cfg.d_model, d_q, bias=cfg.bias)
        self.width = d_q

    def fused_weights(self) -> FusedRows:
        return [(self.w_q.weight, self.w_q.bias)]

    def finish(self, u: Tensor, part: Tensor) -> Tensor:
        return part

    def forward(self, u: Tensor) -> Tensor:
        return self.w_q(u)


@QUERIES.register("identity")
class IdentityQuery(QueryPart):
    """q = u: W_Q fixed to I (Karbevski & Mijoski 2025)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()

    def finish(self, u: Tensor, part: Tensor) -> Tensor:
        return u

    def forward(self, u: Tensor) -> Tensor:
        return u


@QUERIES.register("nonlinear")
class NonlinearQuery(QueryPart):
    """q = (u + f(u)) / 2 (seed 001). With ``scale_form`` q = u + f(u) and the softmax scale is
    halved instead, which equals the explicit /2 only while q enters the logits linearly."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d = cfg.d_model
        r = max(1, int(round(cfg.query.ratio * d)))
        self.f = Bottleneck(d, d, r, cfg.query.activation, cfg.bias, cfg.norm.bias, cfg.norm.eps)
        self.width = r
        self.scale_form = cfg.query.scale_form
        self.scale_multiplier = 0.5 if self.scale_form else 1.0

    def _combine(self, u: Tensor, f: Tensor) -> Tensor:
        return u + f if self.scale_form else (u + f) * 0.5

    def fused_weights(self) -> FusedRows:
        return [self.f.fused_weight()]

    def finish(self, u: Tensor, part: Tensor) -> Tensor:
        return self._combine(u, self.f.out(self.f.hidden_from_fused(u, part)))

    def forward(self, u: Tensor) -> Tensor:
        return self._combine(u, self.f(u))


@QUERIES.register("anchored")
class AnchoredQuery(QueryPart):
    """q = u W_Q + f(u) with f's final LN affine at zero (unchanged at init), or the mean form."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d, d_q = cfg.d_model, cfg.attention.n_heads * cfg.head_dim
        r = max(1, int(round(cfg.query.ratio * d)))
        self.w_q = Linear(d, d_q, bias=cfg.bias)
        self.f = Bottleneck(d, d_q, r, cfg.query.activation, cfg.bias, cfg.norm.bias, cfg.norm.eps)
        self.f.ln.zero_init = True
        self.mean = cfg.query.anchored_mean
        self.width = d_q + r
        self.d_q = d_q

    def _combine(self, lin: Tensor, f: Tensor) -> Tensor:
        return (lin + f) * 0.5 if self.mean else lin + f

    def fused_weights(self) -> FusedRows:
        return [(self.w_q.weight, self.w_q.bias), self.f.fused_weight()]

    def finish(self, u: Tensor, part: Tensor) -> Tensor:
        lin, h = part.split([self.d_q, self.width - self.d_q], dim=-1)
        return self._combine(lin, self.f.out(self.f.hidden_from_fused(u, h)))

    def forward(self, u: Tensor) -> Tensor:
        return self._combine(self.w_q(u), self.f(u))


def make_query(cfg: ModelConfig) -> QueryPart:
    return QUERIES[cfg.query.kind](cfg)
