"""Chunked cross-attention (CCA, RETRO §2.4), the built-in ``cross_attention`` part.

The decoder input of T tokens is cut into chunks of m; for each chunk j the database returned k
neighbours of r tokens (the retrieved chunk plus its continuation), encoded once per forward to
``E_j`` [k r, d]. Token p reads the neighbours of chunk ``j(p) = (p + 1) // m - 1``: the last chunk
whose every token p has already seen (RETRO's shift by m - 1: the last token of chunk j already
uses chunk j's neighbours). Tokens p < m - 1 read nothing (output 0). So no token sees neighbours
that were chosen with its own future.

    CCA(h)_p = Attn(q = Norm(h)_p W_Q, K = E_{j(p)} W_K, V = E_{j(p)} W_V) W_O   (0 if j(p) < 0)

The attention is an ordinary cross-attention layer assembled from the config's query, key, value
and mixer parts (``attention_layer.Attention(cross=True)``), so an attention part under study runs
in the decoder, in the neighbour encoder (both are ordinary blocks) and in CCA alike.
Cost per CCA layer: params 2 d d_q + 2 d d_kv (+ norm, with the baseline parts); FLOPs per token
2(d d_q + d_q d) for q and W_O, 4 k r d_h H for the scores and the weighted sum, and the K/V
projections of k r neighbour tokens per chunk, 4 d d_kv k r / m per token. Implementation: the
shifted sequence is reshaped to [B C, m, d] so each chunk attends to its own [B C, k r, d]
memory in one batched call. Cached decoding (RETRO §2.6 with a K/V cache): a token reads one
chunk's keys and values, computed once when the chunk completes and kept in the cache, so a
decoding step costs q, W_O and 4 k r d_h H, not the chunk's K/V projections again.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.model.attention_layer import Attention
from attnlab.model.context import AttnContext
from attnlab.parts import (
    CrossAttentionPart,
    Dims,
    Init,
    Part,
    PartOptions,
    default_init,
    register,
    registry,
)
from attnlab.parts.registry import build
from attnlab.parts.tp import TPPlan


@register("cross_attention", "cca")
class ChunkedCrossAttention(CrossAttentionPart):
    """One CCA layer: pre-norm, then cross-attention per chunk to its encoded neighbours; with
    the K/V cache, token by token, each chunk's keys and values projected once."""

    supports_kv_cache = True

    def __init_subclass__(cls, **kw) -> None:
        """A subclass with a forward of its own (a plugin's variant written for the full
        forward) decodes without the cache unless it declares ``supports_kv_cache`` itself."""
        super().__init_subclass__(**kw)
        if "forward" in cls.__dict__ and "supports_kv_cache" not in cls.__dict__:
            cls.supports_kv_cache = False

    cost = "params 2 d d_q + 2 d d_kv + norm; FLOPs 4 d d_q + 4 k r d_h H + 4 d d_kv k r / m"
    #: the built-in part's attnlab params row
    param_label = "cca"

    @classmethod
    def param_count(cls, opts: PartOptions, dims: Dims) -> int | None:
        """The norm's and the cross-attention's parts' declared counts (the query, key, value
        and mixer parts of the config, the plain head readout, qk-norm gains); None when one of
        them declares none."""
        cfg = dims.model
        if cfg is None:
            return None
        d = Dims.from_config(cfg, cross=True)
        heads = registry.get("readout", "heads").options(kind="heads")
        mixer_d = d.with_(mixer_in=registry.get("readout", "heads").cls.width(heads, d))
        parts = [
            (cfg.norm, Dims.from_config(cfg), "norm"),
            (cfg.query, d, "query"),
            (cfg.key, d, "key"),
            (cfg.value, d, "value"),
            (heads, d, "readout"),
            (cfg.mixer, mixer_d, "mixer"),
        ]
        counts = [registry.get(slot, o.kind).cls.param_count(o, dd) for o, dd, slot in parts]
        if any(c is None for c in counts):
            return None
        return sum(counts) + (2 * d.head_dim if cfg.attention.qk_norm else 0)

    def __init__(self, opts: PartOptions, dims: Dims) -> None:
        super().__init__(opts, dims)
        cfg = dims.model
        self.m = cfg.retrieval.chunk_size
        self.norm = build(cfg.norm, Dims.from_config(cfg), "norm")
        self.cross_attention = Attention(cfg, cross=True)

    def tp_plan(self) -> TPPlan:
        return TPPlan()  # its norm and its cross-attention's parts declare their own

    def init_weights(self, init: Init) -> None:
        """The model's own order: a part inside initialises itself, any other module gets the
        default init (what the model did when CCA was not a part: the same numbers)."""
        done: set[int] = set()
        for m in self.modules():
            if id(m) in done or m is self:
                continue
            if isinstance(m, Part):
                m.init_weights(init)
                done.update(id(s) for s in m.modules())
            else:
                default_init(m, init.std)

    def flops_per_token(self, seq_len: int) -> int:
        """q and W_O per decoder token, K and V per neighbour token (k r of them per chunk of m
        tokens), and the scores and weighted sum over k r keys."""
        r = self.dims.model.retrieval
        kr = r.neighbours * r.neighbour_len
        a, total = self.cross_attention, 0
        kv = {id(x) for x in (*a.key.modules(), *a.value.modules())}
        for mod in a.modules():
            if isinstance(mod, nn.Linear):
                flops = 2 * mod.in_features * mod.out_features
                total += round(flops * kr / r.chunk_size) if id(mod) in kv else flops
        return total + 4 * kr * a.dh * a.heads_out

    def forward(
        self, h: Tensor, memory: Tensor, start: int = 0, state: dict | None = None
    ) -> Tensor:
        """h [B, T, d], memory [B, C, k r, d] (encoded neighbours of chunks 0..C-1) -> [B, T, d].

        Needs C >= ceil((T - m + 1) / m) (= T / m when m divides T). Cached decoding
        (``state``: this layer's dict in the K/V cache): h holds positions start..start+T-1,
        memory every chunk they may read, and each chunk's keys and values are computed once
        (:meth:`_decode`)."""
        if state is not None:
            return self._decode(h, memory, start, state)
        B, T, d = h.shape
        m = self.m
        if m > T:  # no chunk is complete yet: nothing to read
            return torch.zeros_like(h)
        x = self.norm(h)[:, m - 1 :]  # token p of the shifted sequence is token p + m - 1
        Ts = x.shape[1]
        C = -(-Ts // m)
        if memory.shape[1] < C:
            raise ValueError(
                f"{T} tokens in chunks of {m} need the neighbours of {C} chunks; got "
                f"{memory.shape[1]}"
            )
        x = F.pad(x, (0, 0, 0, C * m - Ts)).reshape(B * C, m, d)
        mem = memory[:, :C].reshape(B * C, memory.shape[2], d)
        dummy = torch.zeros(0, dtype=torch.long, device=h.device)
        ctx = AttnContext(dummy, dummy, None, False)
        out, _ = self.cross_attention(x, ctx, memory=mem)
        out = out.reshape(B, C * m, d)[:, :Ts]
        return F.pad(out, (0, 0, m - 1, 0))

    def _decode(self, h: Tensor, memory: Tensor, start: int, state: dict) -> Tensor:
        """Token p = start + t reads chunk j(p) = (p + 1) // m - 1 (0 where j(p) < 0), through
        the keys and values of each chunk kept in ``state["kv"]`` ([B, C, H_kv, k r, d_h]),
        the new chunks' added here: a chunk's neighbours are projected once however many
        tokens read them. Per token: q, W_O and the k r scores, as in the chunked forward."""
        B, T, d = h.shape
        j = (torch.arange(start, start + T, device=h.device) + 1) // self.m - 1
        if int(j.max()) < 0:
            return torch.zeros_like(h)
        if memory.shape[1] <= int(j.max()):
            raise ValueError(
                f"position {start + T - 1} reads chunk {int(j.max())}; got the neighbours of "
                f"{memory.shape[1]} chunks"
            )
        kv, C = state.get("kv"), memory.shape[1]
        done = 0 if kv is None else kv[0].shape[1]
        if done < C:
            S = memory.shape[2]
            k, v = self.cross_attention.memory_kv(memory[:, done:].reshape(-1, S, d))
            k, v = (t.reshape(B, C - done, *t.shape[1:]) for t in (k, v))
            kv = (k, v) if kv is None else (torch.cat([kv[0], k], 1), torch.cat([kv[1], v], 1))
            state["kv"] = kv
        at = j.clamp(min=0)
        k, v = (t[:, at].flatten(0, 1) for t in kv)  # [B T, H_kv, k r, d_h]
        x = self.norm(h).reshape(B * T, 1, d)
        dummy = torch.zeros(0, dtype=torch.long, device=h.device)
        out, _ = self.cross_attention(x, AttnContext(dummy, dummy, None, False), kv=(k, v))
        return torch.where((j >= 0).view(1, T, 1), out.reshape(B, T, d), 0.0)
