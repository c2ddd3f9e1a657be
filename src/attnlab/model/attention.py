"""The attention core: softmax(q k^T * scale + bias, masked) v, per head, with GQA/MQA.

FLOPs 4 * T_q * T_k * d_h per head. The fused path calls ``F.scaled_dot_product_attention``
(flash / memory-efficient kernels where the device has them; O(T) memory). A part that reads or
rewrites the T x T matrix itself (virtual heads, or returning the maps) takes the explicit path,
which materialises the [B, H, T_q, T_k] logits: O(T^2 * H) memory.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class AttentionCore(nn.Module):
    """Scaled dot-product attention over [B, H, T, d_h] tensors.

    ``score_transform`` (optional) maps the [B, H, Tq, Tk] logits or probabilities to new ones
    ([B, H', Tq, Tk]); it has an attribute ``on`` in {"logits", "probs"}.
    """

    def __init__(
        self,
        head_dim: int,
        backend: str = "auto",
        dropout: float = 0.0,
        scale_multiplier: float = 1.0,
        score_transform: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.scale = scale_multiplier / math.sqrt(head_dim)
        self.backend = backend
        self.dropout = dropout
        self.score_transform = score_transform

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        allowed: Tensor | None,
        is_causal: bool,
        bias: Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """q [B,H,Tq,dh], k/v [B,Hkv,Tk,dh]; allowed [Tq,Tk] bool or None (with is_causal)."""
        drop = self.dropout if self.training else 0.0
        if not need_weights and self.score_transform is None and self.backend != "math":
            return self._fused(q, k, v, allowed, is_causal, bias, drop), None
        return self._explicit(q, k, v, allowed, is_causal, bias, drop)

    def _fused(self, q, k, v, allowed, is_causal, bias, drop) -> Tensor:
        mask = None
        if bias is not None:
            mask = bias.to(q.dtype)
            if allowed is None and is_causal:
                allowed = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device)
                allowed = allowed.tril(k.shape[2] - q.shape[2])
            if allowed is not None:
                mask = mask.masked_fill(~allowed, float("-inf"))
            is_causal = False
        elif allowed is not None:
            mask, is_causal = allowed, False
        gqa = q.shape[1] != k.shape[1]
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=drop,
            is_causal=is_causal,
            scale=self.scale,
            enable_gqa=gqa,
        )

    def _explicit(self, q, k, v, allowed, is_causal, bias, drop) -> tuple[Tensor, Tensor]:
        Tq, Tk = q.shape[2], k.shape[2]
        if allowed is None:
            allowed = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device)
            if is_causal:
                allowed = allowed.tril(Tk - Tq)
        if q.shape[1] != k.shape[1]:
            rep = q.shape[1] // k.shape[1]
            k = k.repeat_interleave(rep, dim=1)
        scores = (q * self.scale) @ k.transpose(-2, -1)  # scale the [T, d_h] side, not [T, T]
        if bias is not None:
            scores = scores + bias.to(scores.dtype)
        t = self.score_transform
        neg = torch.finfo(scores.dtype).min
        if t is not None and t.on == "logits":
            scores = t(scores.masked_fill(~allowed, 0.0), allowed)
        probs = torch.softmax(scores.masked_fill(~allowed, neg), dim=-1)
        if t is not None and t.on == "probs":
            probs = t(probs, allowed).masked_fill(~allowed, 0.0)
            probs = probs / probs.sum(-1, keepdim=True).clamp_min(1e-9)
        probs = probs.masked_fill(~allowed, 0.0)
        if drop:
            probs = F.dropout(probs, drop)
        if probs.shape[1] != v.shape[1]:
            v = v.repeat_interleave(probs.shape[1] // v.shape[1], dim=1)
        return probs @ v, probs
