"""The attention sub-layer, in the order of the seed figures:
x~ -> q, k, v -> (qk-norm) -> rotary -> [cache] -> attention core -> [identity head] -> head mixing.

Params (MHA, linear query, no bias): W_Q d*d_q + W_K, W_V d*d_kv each + W_O d_q*d.
With ``query.fused`` the parts that read x~ linearly (W_Q or W1, W_K, W_V) run as one matmul.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.model.attention import AttentionCore
from attnlab.model.context import AttnContext
from attnlab.model.identity_head import IdentityHead
from attnlab.model.kv_cache import KVCache
from attnlab.model.linear import Linear, matmul_split, param_key, split_columns, uses_layout
from attnlab.model.mixing import make_mixer
from attnlab.model.norms import RMSNorm
from attnlab.model.positions import Rotary
from attnlab.model.query import make_query
from attnlab.model.virtual_heads import VirtualHeads


def _make_value(cfg: ModelConfig, d_kv: int) -> nn.Module:
    if cfg.moe_values.enabled:
        from attnlab.model.moe import MoEValues

        return MoEValues(cfg.d_model, d_kv, cfg.moe_values, cfg.bias)
    return Linear(cfg.d_model, d_kv, bias=cfg.bias)


class Attention(nn.Module):
    """Self- or cross-attention with every configured part."""

    def __init__(self, cfg: ModelConfig, *, cross: bool = False, rotary: Rotary | None = None):
        super().__init__()
        H, Hkv, dh = cfg.attention.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.H, self.Hkv, self.dh, self.cross = H, Hkv, dh, cross
        self.query = make_query(cfg)
        self.key = Linear(cfg.d_model, Hkv * dh, bias=cfg.bias)
        self.value = _make_value(cfg, Hkv * dh)
        self.fused = cfg.query.fused and not cross and isinstance(self.value, nn.Linear)
        self.q_norm = RMSNorm(dh, eps=cfg.norm.eps) if cfg.attention.qk_norm else None
        self.k_norm = RMSNorm(dh, eps=cfg.norm.eps) if cfg.attention.qk_norm else None
        self.rotary = None if cross else rotary
        vh = cfg.virtual_heads
        self.virtual = VirtualHeads(H, vh) if vh.enabled and not cross else None
        n_heads_out = (vh.n_virtual or H) if self.virtual is not None else H
        self.core = AttentionCore(
            dh,
            backend=cfg.attention.backend,
            dropout=cfg.attention.dropout,
            scale_multiplier=self.query.scale_multiplier,
            score_transform=self.virtual,
        )
        use_id = cfg.identity_head.enabled and not cross
        self.identity_head = (
            IdentityHead(cfg.d_model, n_heads_out, dh, cfg.bias) if use_id else None
        )
        n_in = (n_heads_out + (1 if use_id else 0)) * dh
        self.mixer = make_mixer(cfg, n_in)

    # -------------------------------------------------------------------------------- projections
    def project_qkv(self, u: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q [B,T,H*dh], k, v [B,T,Hkv*dh] from x~ (fused or unfused: same values)."""
        if not self.fused:
            return self.query(u), self.key(u), self.value(u)
        split = self._layout_params is not None and uses_layout(u)
        weight, bias = self._fused_weight(split)
        out = matmul_split(u, weight, bias) if split else F.linear(u, weight, bias)
        d_kv = self.Hkv * self.dh
        part, k, v = out.split([self.query.width, d_kv, d_kv], dim=-1)
        return self.query.finish(u, part), k, v

    _layout_params: tuple[Tensor, ...] | None = None

    def set_decode_layout(self, on: bool) -> None:
        """Inside ``decode_layout``: few-row inputs use the fused weight split by columns."""
        self._layout_params = self._fused_params() if on else None

    def _fused_params(self) -> tuple[Tensor, ...]:
        return tuple(p for m in (self.query, self.key, self.value) for p in m.parameters())

    def _fused_weight(self, split: bool = False) -> tuple[Tensor, Tensor | None]:
        """The concatenated [W_Q or W1 | W_K | W_V] (and bias); with ``split`` its
        ``split_columns`` blocks. Without autograd (decoding, evaluation) it is cached until a
        parameter changes (in-place update, move or cast): re-concatenating per decoded token
        would copy as many bytes as the matmul reads."""
        cacheable = not torch.is_grad_enabled() and not torch.compiler.is_compiling()
        if cacheable:
            # listing the parameters costs more than a decoded token's matmul: done once per layout
            params = self._layout_params or self._fused_params()
            key = (split, param_key(params))
            hit = getattr(self, "_fused_cache", None)
            if hit is not None and hit[0] == key:
                return hit[1], hit[2]
        rows = [
            *self.query.fused_weights(),
            (self.key.weight, self.key.bias),
            (self.value.weight, self.value.bias),
        ]
        weight = torch.cat([w for w, _ in rows])
        bias = None
        if any(b is not None for _, b in rows):
            bias = torch.cat([b if b is not None else w.new_zeros(w.shape[0]) for w, b in rows])
        if split:
            weight = split_columns(weight)
        if cacheable:
            self._fused_cache = (key, weight, bias)
        return weight, bias

    def _heads(self, t: Tensor, n: int) -> Tensor:
        B, T, _ = t.shape
        return t.view(B, T, n, self.dh).transpose(1, 2)

    # ------------------------------------------------------------------------------------ forward
    def forward(
        self,
        u: Tensor,
        ctx: AttnContext,
        *,
        cache: KVCache | None = None,
        slot: int = 0,
        memory: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """u [B,T,d] -> [B,T,d] (and the attention maps when ctx.need_weights)."""
        if self.cross:
            q = self.query(u)
            if cache is not None and slot in cache.cross:
                k, v = cache.cross[slot]
            else:
                k = self._heads(self.key(memory), self.Hkv)
                v = self._heads(self.value(memory), self.Hkv)
                if cache is not None:
                    cache.cross[slot] = (k, v)
        else:
            q, k, v = self.project_qkv(u)
            k, v = self._heads(k, self.Hkv), self._heads(v, self.Hkv)
        q = self._heads(q, self.H)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary is not None:
            q = self.rotary.apply(q, *ctx.rope)
            k = self.rotary.apply(k, *ctx.rope)
        if cache is not None and not self.cross:
            k, v = cache.update(slot, k, v, ctx.start)
        if self.cross:
            out, probs = self.core(
                q, k, v, allowed=None, is_causal=False, need_weights=ctx.need_weights
            )
        else:
            out, probs = self.core(
                q,
                k,
                v,
                allowed=ctx.allowed,
                is_causal=ctx.is_causal,
                bias=ctx.bias,
                need_weights=ctx.need_weights,
            )
        if self.identity_head is not None:
            mixed_in = self.identity_head(u, out)
        else:
            B, _, T, _ = out.shape
            mixed_in = out.transpose(1, 2).reshape(B, T, -1)
        return self.mixer(mixed_in), probs
