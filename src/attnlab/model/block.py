"""One transformer block, read in the order of the seed figures, each step a slot's part:

  norm -> feature map -> q, k, v -> positions -> score -> readout -> mixer
       -> residual + side branch -> (cross-attention) -> FFN

sequential pre-LN:  h = x + A(P(N1 x)) + S(P(N1 x));  y = h + F(N2 h)
post-LN:            h = N1(x + A(P x) + S(P x));       y = N2(h + F(h))
parallel (GPT-NeoX): y = x + A(P(N1 x)) + F(N2 x) + S(P(N1 x))
P is ``model.feature_map`` (the pre-projection of seed 000, or nothing), S ``model.side_branch``
(the content skip, or nothing), F ``model.ffn``. ``residual = false`` drops the "x +" and "h +"
terms; ``mlp = false`` drops F (seed 004).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.model.attention_layer import Attention
from attnlab.model.context import AttnContext
from attnlab.model.kv_cache import KVCache
from attnlab.parts import Dims
from attnlab.parts.registry import build


class DropPath(nn.Module):
    """Stochastic depth (Huang et al. 2016): zero a branch per sample with probability p, scale
    survivors by 1/(1-p). Identity at eval."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = torch.empty(x.shape[0], *([1] * (x.ndim - 1)), device=x.device, dtype=x.dtype)
        return x * keep.bernoulli_(1 - self.p) / (1 - self.p)


class Block(nn.Module):
    """Self-attention (+ optional cross-attention) and FFN with the configured parts."""

    def __init__(
        self,
        cfg: ModelConfig,
        *,
        cross: bool = False,
        drop_path: float = 0.0,
    ) -> None:
        super().__init__()
        dims = Dims.from_config(cfg)
        self.post = cfg.norm_position == "post"
        self.parallel = cfg.residual_kind == "parallel"
        self.residual = cfg.residual
        self.norm1 = build(cfg.norm, dims, "norm")
        self.feature_map = build(cfg.feature_map, dims, "feature_map")
        self.attention = Attention(cfg)
        self.side_branch = build(cfg.side_branch, dims, "side_branch")
        self.cross_norm = build(cfg.norm, dims, "norm") if cross else None
        self.cross_attention = Attention(cfg, cross=True) if cross else None
        self.ffn = build(cfg.ffn, dims, "ffn") if cfg.mlp else None
        self.norm2 = build(cfg.norm, dims, "norm") if cfg.mlp else None
        self.drop = nn.Dropout(cfg.dropout)
        self.drop_path = DropPath(drop_path)

    def _branch(self, y: Tensor) -> Tensor:
        if not self.training:  # both are the identity at eval (saves two calls per branch)
            return y
        return self.drop_path(self.drop(y))

    def forward(
        self,
        x: Tensor,
        ctx: AttnContext,
        *,
        cache: KVCache | None = None,
        slot: int = 0,
        memory: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        x_hat = x if self.post else self.norm1(x)
        x_tilde = self.feature_map(x_hat) if self.feature_map is not None else x_hat
        attn, probs = self.attention(x_tilde, ctx, cache=cache, slot=slot)
        h = self._branch(attn)
        if self.side_branch is not None:
            h = h + self.side_branch(x_tilde)
        if self.parallel:
            return x + h + self._branch(self.ffn(self.norm2(x))), probs
        if self.residual:
            h = x + h
        if self.post:
            h = self.norm1(h)
        if self.cross_attention is not None:
            c_in = h if self.post else self.cross_norm(h)
            c, _ = self.cross_attention(c_in, ctx, cache=cache, slot=slot, memory=memory)
            h = h + self._branch(c) if self.residual else self._branch(c)
            if self.post:
                h = self.cross_norm(h)
        if self.ffn is not None:
            f = self._branch(self.ffn(h if self.post else self.norm2(h)))
            h = h + f if self.residual else f
            if self.post:
                h = self.norm2(h)
        return h, probs
