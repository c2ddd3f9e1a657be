"""One transformer block, read in the order of the seed figures:

  norm -> pre-projection -> q, k, v -> positions -> attention -> head mixing
       -> residual + content skip -> (cross-attention) -> FFN

sequential pre-LN:  h = x + A(P(N1 x)) + S(P(N1 x));  y = h + F(N2 h)
post-LN:            h = N1(x + A(P x) + S(P x));       y = N2(h + F(h))
parallel (GPT-NeoX): y = x + A(P(N1 x)) + F(N2 x) + S(P(N1 x))
``residual = false`` drops the "x +" and "h +" terms; ``mlp = false`` drops F (seed 004).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.model.attention_layer import Attention
from attnlab.model.content_skip import ContentSkip
from attnlab.model.context import AttnContext
from attnlab.model.ffn import make_ffn
from attnlab.model.kv_cache import KVCache
from attnlab.model.norms import make_norm
from attnlab.model.positions import Rotary
from attnlab.model.pre_projection import PreProjection


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
        rotary: Rotary | None = None,
        cross: bool = False,
        drop_path: float = 0.0,
    ) -> None:
        super().__init__()
        d = cfg.d_model
        self.post = cfg.norm_position == "post"
        self.parallel = cfg.residual_kind == "parallel"
        self.residual = cfg.residual
        self.norm1 = make_norm(cfg.norm, d)
        self.pre_projection = (
            PreProjection(d, cfg.pre_projection) if cfg.pre_projection.enabled else None
        )
        self.attention = Attention(cfg, rotary=rotary)
        self.content_skip = ContentSkip(d, cfg.content_skip) if cfg.content_skip.enabled else None
        self.cross_norm = make_norm(cfg.norm, d) if cross else None
        self.cross_attention = Attention(cfg, cross=True) if cross else None
        self.ffn = make_ffn(cfg) if cfg.mlp else None
        self.norm2 = make_norm(cfg.norm, d) if cfg.mlp else None
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
        x_tilde = self.pre_projection(x_hat) if self.pre_projection is not None else x_hat
        attn, probs = self.attention(x_tilde, ctx, cache=cache, slot=slot)
        h = self._branch(attn)
        if self.content_skip is not None:
            h = h + self.content_skip(x_tilde)
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
