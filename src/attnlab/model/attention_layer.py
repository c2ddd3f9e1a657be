"""The attention sub-layer, in the order of the seed figures, one slot per step:

    x~ -> query, key, value -> (qk-norm) -> position rotation -> [cache] -> score -> readout
       -> mixer

Every step is the part its slot names in the config (``model.query``, ``model.key``,
``model.value``, ``model.score``, ``model.readout``, ``model.mixer``). When every projection part
can be fused (``fused_weights``) and ``model.attention.fuse_qkv`` is on, the projections that read
x~ linearly run as one matmul d -> (r_q + 2 d_kv), each part finishing its own slice.
Params (baseline): W_Q d*d_q + W_K, W_V d*d_kv each + W_O d_q*d. Under tensor parallelism
(``tp``, set by ``attnlab.model.tensor_parallel``) H and H_kv are the rank's heads and the
steps that cross heads go through :class:`~attnlab.model.tp_heads.HeadSplit`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.model.attention import AttentionCore
from attnlab.model.attention_normaliser import normaliser_for
from attnlab.model.context import AttnContext
from attnlab.model.kv_cache import KVCache
from attnlab.model.linear import DecodeLayout, matmul_split, param_key, split_columns, uses_layout
from attnlab.model.norms import RMSNorm
from attnlab.model.tp_heads import HeadSplit
from attnlab.parts import Dims, ScoreContext, registry
from attnlab.parts.registry import build


class Attention(DecodeLayout, nn.Module):
    """Self- or cross-attention assembled from the configured parts."""

    def __init__(self, cfg: ModelConfig, *, cross: bool = False):
        super().__init__()
        dims = Dims.from_config(cfg, cross=cross)
        H, Hkv, dh = dims.n_heads, dims.n_kv_heads, dims.head_dim
        self.H, self.Hkv, self.dh, self.cross = H, Hkv, dh, cross
        self.query = build(cfg.query, dims, "query")
        self.key = build(cfg.key, dims, "key")
        self.value = build(cfg.value, dims, "value")
        rows = [p.fused_weights() for p in (self.query, self.key, self.value)]
        self.fused = cfg.attention.fuse_qkv and not cross and all(r is not None for r in rows)
        self.q_norm = RMSNorm(dh, eps=cfg.norm.eps) if cfg.attention.qk_norm else None
        self.k_norm = RMSNorm(dh, eps=cfg.norm.eps) if cfg.attention.qk_norm else None
        # cross-attention reads the encoder as it is: no score transform, plain head readout
        self.score = None if cross else build(cfg.score, dims, "score")
        if self.score is not None:
            dims = dims.with_(heads_out=type(self.score).heads_out(cfg.score, dims))
        #: heads leaving the score slot (H, or H' virtual heads)
        self.heads_out = dims.heads_out
        self.core = AttentionCore(
            dh,
            backend=cfg.attention.backend,
            dropout=cfg.attention.dropout,
            scale_multiplier=self.query.scale_multiplier,
            normaliser=normaliser_for(cfg.attention, cfg.max_seq_len),
        )
        #: a score part declared as engine mods / a normaliser (or none): the engine runs it
        self.declared = self.score is None or type(self.score).declares()
        readout = (
            cfg.readout if not cross else registry.get("readout", "heads").options(kind="heads")
        )
        self.readout = build(readout, dims, "readout")
        dims = dims.with_(mixer_in=type(self.readout).width(readout, dims))
        self.mixer = build(cfg.mixer, dims, "mixer")

    #: the head split over a ``tp`` mesh (None: one process holds every head)
    tp: HeadSplit | None = None

    # -------------------------------------------------------------------------------- projections
    def project_qkv(self, u: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q [B,T,H*dh], k, v [B,T,Hkv*dh] from x~ (fused or unfused: same values)."""
        if not self.fused:
            return self.query(u), self.key(u), self.value(u)
        split = self._layout_params is not None and uses_layout(u)
        weight, bias = self._fused_weight(split)
        out = matmul_split(u, weight, bias) if split else F.linear(u, weight, bias)
        widths = [p.fused_width for p in (self.query, self.key, self.value)]
        q, k, v = out.split(widths, dim=-1)
        return self.query.finish(u, q), self.key.finish(u, k), self.value.finish(u, v)

    _layout_params: tuple[Tensor, ...] | None = None

    def set_decode_layout(self, on: bool) -> None:
        """Inside ``decode_layout``: few-row inputs use the fused weight split by columns."""
        self._layout_params = self._fused_params() if on and self.fused else None

    def _fused_params(self) -> tuple[Tensor, ...]:
        return tuple(p for m in (self.query, self.key, self.value) for p in m.parameters())

    def _fused_weight(self, split: bool = False) -> tuple[Tensor, Tensor | None]:
        """The concatenated rows of the query, key and value parts (and bias); with ``split``
        its ``split_columns`` blocks. Without autograd (decoding, evaluation) it is cached until
        a parameter changes (in-place update, move or cast): re-concatenating per decoded token
        would copy as many bytes as the matmul reads."""
        cacheable = not torch.is_grad_enabled() and not torch.compiler.is_compiling()
        if cacheable:
            # listing the parameters costs more than a decoded token's matmul: done once per layout
            params = self._layout_params or self._fused_params()
            key = (split, param_key(params))
            hit = getattr(self, "_fused_cache", None)
            if hit is not None and hit[0] == key:
                return hit[1], hit[2]
        rows = [r for p in (self.query, self.key, self.value) for r in p.fused_weights()]
        weight = torch.cat([w for w, _ in rows])
        bias = None
        if any(b is not None for _, b in rows):
            bias = torch.cat([b if b is not None else w.new_zeros(w.shape[0]) for w, b in rows])
        if split:
            weight = split_columns(weight)
        if cacheable:
            self._fused_cache = (key, weight, bias)
        return weight, bias

    def memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Cross-attention's keys and values of ``memory`` [B, S, d]: [B, H_kv, S, d_h] each
        (this rank's heads under tensor parallelism)."""
        k, v = self.key(memory), self.value(memory)
        if self.tp is not None:
            k, v = self.tp.keys_values(k, v)
        return self._heads(k, self.Hkv), self._heads(v, self.Hkv)

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
        kv: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """u [B,T,d] -> [B,T,d] (and the attention maps when ctx.need_weights). Cross-attention
        reads ``memory`` [B, S, d], or its keys and values ``kv`` (:meth:`memory_kv`) kept by
        the caller."""
        tp = self.tp
        if self.cross:
            q = self.query(u) if tp is None else tp.query(self.query(u))
            if kv is not None:
                k, v = kv
            elif cache is not None and slot in cache.cross:
                k, v = cache.cross[slot]
            else:
                k, v = self.memory_kv(memory)
                if cache is not None:
                    cache.cross[slot] = (k, v)
            sctx = ScoreContext(None, False, None, ctx.need_weights)
        else:
            q, k, v = self.project_qkv(u)
            if tp is not None:
                q, (k, v) = tp.query(q), tp.keys_values(k, v)
            k, v = self._heads(k, self.Hkv), self._heads(v, self.Hkv)
            if not self.declared:  # a part that forms the matrix reads the dense forms (T x T)
                sctx = ScoreContext(
                    ctx.allowed, ctx.is_causal, ctx.bias, ctx.need_weights, ctx.padding
                )
        q = self._heads(q, self.H)
        if self.q_norm is not None and tp is not None:
            q, k = tp.norm(self.q_norm, q), tp.norm(self.k_norm, k)
        elif self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if ctx.rotate is not None and not self.cross:
            q, k = ctx.rotate(q), ctx.rotate(k)
        if cache is not None and not self.cross:
            k, v = cache.update(slot, k, v, ctx.start)
        if self.declared and not self.cross:
            own = self.score.score_mods() if self.score is not None else ()
            norm = self.score.normaliser() if self.score is not None else None
            mods = (*ctx.mods, *own)
            sctx = ScoreContext(
                None, False, None, ctx.need_weights, ctx.padding, ctx.mask, mods, norm, ctx.start
            )
        if tp is not None:
            heads, probs = tp.score(self, q, k, v, sctx)
            return tp.mix(self, u, heads), probs
        if self.declared and not self.cross:
            heads, probs = self.core(q, k, v, sctx)
        elif self.score is not None:
            heads, probs = self.score(q, k, v, self.core, sctx)
        else:
            heads, probs = self.core(q, k, v, sctx)
        return self.mixer(self.readout(u, heads)), probs
