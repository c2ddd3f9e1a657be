"""The attention core: normalise(mods(q k^T * scale), masked) v, per head, with GQA/MQA.

FLOPs 4 * T_q * T_k * d_h per head. ``attend`` runs a layer's mask (the mask part's), score
mods (the position and score parts') and normaliser through the attention engine
(``model/engine``, ``docs/attention-engine.md``): with nothing declared and a mask that is
SDPA's own (causal from position 0, full, one decoded token) it is exactly ``sdpa``'s call
below, bit for bit; otherwise the engine picks block-sparse SDPA, flex or its explicit path and
logs which and why once. Score parts that rewrite the T x T matrix call the two paths
themselves:

- ``sdpa``: ``F.scaled_dot_product_attention`` (flash / memory-efficient kernels where the device
  has them; O(T) memory). ``backend`` picks the kernels it may use: ``auto`` lets torch choose,
  ``flash`` allows only FlashAttention, ``sdpa`` any fused kernel (flash, memory-efficient,
  cuDNN) but never torch's unfused math fallback.
- ``explicit``: materialises the [B, H, T_q, T_k] logits (O(T^2 * H) memory), for a part that
  reads or rewrites the T x T matrix (a score part with ``needs_attention_matrix``), for
  returning the maps, and for ``backend = "math"``.

``backend = "flex"`` asks the engine for FlexAttention on every call that is not the plain
baseline (refused where flex cannot run, e.g. CPU training: flex has no CPU backward).
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnlab.base.errors import UserError
from attnlab.model.engine import (
    AttentionEngine,
    AttentionSpec,
    Causal,
    EngineOptions,
    Full,
    Plan,
    Softmax,
)
from attnlab.model.engine.plan import announce
from attnlab.model.masks import dense_allowed
from attnlab.parts import ScoreContext

_BACKENDS = {
    "flash": [SDPBackend.FLASH_ATTENTION],
    "sdpa": [
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
        SDPBackend.CUDNN_ATTENTION,
    ],
}


class AttentionCore(nn.Module):
    """Scaled dot-product attention over [B, H, T, d_h] tensors."""

    def __init__(
        self,
        head_dim: int,
        backend: str = "auto",
        dropout: float = 0.0,
        scale_multiplier: float = 1.0,
        normaliser=None,
    ) -> None:
        super().__init__()
        self.scale = scale_multiplier / math.sqrt(head_dim)
        self.backend = backend
        self.dropout = dropout
        #: the engine normaliser (softmax unless ``model.attention.normaliser`` or a part says)
        self.normaliser = normaliser if normaliser is not None else Softmax()
        path = "flex" if backend == "flex" else "auto"
        self.engine = AttentionEngine(AttentionSpec(), EngineOptions(path=path))
        #: the path the last call took, whichever ran it (the engine, or the two calls below)
        self.last_plan: Plan | None = None
        self._said: tuple | None = None  # (key, plan) of the last ``_say``: decoding repeats it

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        mask,
        mods: tuple = (),
        start: int = 0,
        padding: Tensor | None = None,
        need_weights: bool = False,
        normaliser=None,
    ) -> tuple[Tensor, Tensor | None]:
        """The layer's attention through the engine: q [B,H,Tq,dh] at positions start..,
        k/v [B,Hkv,Tk,dh] -> (out [B,H,Tq,dh], weights [B,H,Tq,Tk] when ``need_weights``)."""
        norm = normaliser if normaliser is not None else self.normaliser
        if self.backend == "math":  # the materialised reference: every mod by its score_mod
            ctx = ScoreContext(None, False, None, need_weights, padding, mask, mods, norm, start)
            return self.explicit(q, k, v, ctx)
        plain = None if padding is not None else mask.dense(q.shape[2], k.shape[2], start)
        baseline = plain is not None and not mods and type(norm) is Softmax
        if baseline and not need_weights:  # today's call, bit for bit
            return self.sdpa(q, k, v, ScoreContext(None, plain == "causal")), None
        self.engine.spec = AttentionSpec(mask, tuple(mods), norm)
        out = self.engine(
            q,
            k,
            v,
            scale=self.scale,
            q_offset=start,
            kv_valid=padding,
            need_weights=need_weights,
            dropout=self.dropout if self.training else 0.0,
        )
        self.last_plan = self.engine.last_plan
        return out

    def forward(self, q: Tensor, k: Tensor, v: Tensor, ctx: ScoreContext):
        """q [B,H,Tq,dh], k/v [B,Hkv,Tk,dh] -> (out [B,H,Tq,dh], probs or None); a context
        with an engine ``mask`` runs through :meth:`attend`."""
        if ctx.mask is not None and ctx.allowed is None and ctx.q_pos is None:
            return self.attend(
                q,
                k,
                v,
                mask=ctx.mask,
                mods=ctx.mods,
                start=ctx.q_offset,
                padding=ctx.padding,
                need_weights=ctx.need_weights,
                normaliser=ctx.normaliser,
            )
        if ctx.need_weights or self.backend == "math":
            return self.explicit(q, k, v, ctx)
        return self.sdpa(q, k, v, ctx), None

    def sdpa(
        self, q: Tensor, k: Tensor, v: Tensor, ctx: ScoreContext, scale: float | None = None
    ) -> Tensor:
        """The fused path (no T x T matrix is kept); ``scale`` replaces the softmax scale (e.g.
        1 for queries a part has already scaled)."""
        drop = self.dropout if self.training else 0.0
        allowed, is_causal, mask = ctx.allowed, ctx.is_causal, None
        dense = allowed is not None or ctx.bias is not None or ctx.padding is not None
        why = "a dense [Tq, Tk] mask or bias" if dense else "nothing declared"
        self._say("sdpa", f"mask is {'causal' if is_causal else 'full'}, {why}", ctx)
        if ctx.padding is not None:
            allowed = _with_padding(allowed, is_causal, ctx.padding, q.shape[2], k.shape[2])
            is_causal = False
        if ctx.bias is not None:
            mask = ctx.bias.to(q.dtype)
            if allowed is None and is_causal:
                allowed = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device)
                allowed = allowed.tril(k.shape[2] - q.shape[2])
            if allowed is not None:
                mask = mask.masked_fill(~allowed, float("-inf"))
            is_causal = False
        elif allowed is not None:
            mask, is_causal = allowed, False
        gqa = q.shape[1] != k.shape[1]
        kernels = _BACKENDS.get(self.backend)
        try:
            with sdpa_kernel(kernels) if kernels else nullcontext():
                return F.scaled_dot_product_attention(
                    q,
                    k,
                    v,
                    attn_mask=mask,
                    dropout_p=drop,
                    is_causal=is_causal,
                    scale=self.scale if scale is None else scale,
                    enable_gqa=gqa,
                )
        except RuntimeError as e:
            if kernels and "backend" in str(e).lower():
                raise UserError(
                    f"model.attention.backend={self.backend!r} has no kernel for this call on "
                    f"{q.device.type} ({q.dtype}, mask={'yes' if mask is not None else 'no'}); "
                    "set model.attention.backend='auto'"
                ) from None
            raise

    def explicit(
        self, q: Tensor, k: Tensor, v: Tensor, ctx: ScoreContext, transform=None
    ) -> tuple[Tensor, Tensor]:
        """The materialised path. ``transform`` (optional, with ``on`` in {"logits", "probs"})
        maps the [B, H, Tq, Tk] logits or probabilities to [B, H', Tq, Tk] ones."""
        drop = self.dropout if self.training else 0.0
        Tq, Tk = q.shape[2], k.shape[2]
        self._say("explicit", _explicit_reason(self.backend, ctx, transform), ctx)
        q_pos = _query_positions(ctx, Tq, Tk, q.device)
        allowed = _explicit_allowed(ctx, q_pos, Tq, Tk, q.shape[0], q.device)
        inside = allowed  # where the scores a transform reads are real (zero elsewhere)
        if ctx.padding is not None:
            allowed = allowed & ctx.padding[:, None, None, :]
            inside = allowed & ctx.padding[:, None, Tk - Tq :, None]
        if q.shape[1] != k.shape[1]:
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        scores = (q * self.scale) @ k.transpose(-2, -1)  # scale the [T, d_h] side, not [T, T]
        if ctx.bias is not None:
            scores = scores + ctx.bias.to(scores.dtype)
        scores = _apply_mods(scores, ctx.mods, q_pos)
        neg = torch.finfo(scores.dtype).min
        on = getattr(transform, "on", None) if transform is not None else None
        if transform is not None and on not in ("logits", "probs"):  # never dropped silently
            raise ValueError(
                f"{type(transform).__name__} passed transform=self to core.explicit with on = "
                f'{on!r}; set on = "logits" (before the softmax) or "probs" (after it)'
            )
        if transform is not None and transform.on == "logits":
            scores = transform.transform(scores.masked_fill(~inside, 0.0), allowed)
        norm = ctx.normaliser if ctx.normaliser is not None else self.normaliser
        if type(norm) is Softmax:
            probs = torch.softmax(scores.masked_fill(~allowed, neg), dim=-1)
        else:  # the normaliser's own explicit form
            probs = norm.weights(scores.masked_fill(~allowed, neg), allowed)
        if transform is not None and transform.on == "probs":
            if ctx.padding is not None:  # a padded query's row is outside the image
                probs = probs.masked_fill(~inside, 0.0)
            probs = transform.transform(probs, allowed).masked_fill(~allowed, 0.0)
            probs = probs / probs.sum(-1, keepdim=True).clamp_min(1e-9)
        probs = probs.masked_fill(~allowed, 0.0)
        if drop:
            probs = F.dropout(probs, drop)
        if probs.shape[1] != v.shape[1]:
            v = v.repeat_interleave(probs.shape[1] // v.shape[1], dim=1)
        return probs @ v, probs

    def _say(self, path: str, reason: str, ctx: ScoreContext) -> None:
        """Keep the path of a call the engine did not run (``last_plan``) and log it once per
        configuration as the engine logs its own (not while compiling: a log call would break
        the graph)."""
        if torch.compiler.is_compiling():
            return
        norm = ctx.normaliser if ctx.normaliser is not None else self.normaliser
        key = (path, reason, id(ctx.mask), ctx.is_causal, ctx.allowed is None, id(norm))
        key += tuple(map(id, ctx.mods))
        if self._said is not None and self._said[0] == key:  # as the last call: said already
            self.last_plan = self._said[1]
            return
        self.last_plan = Plan(path, reason)
        self._said = (key, self.last_plan)
        mask = ctx.mask
        if mask is None and ctx.allowed is None:
            mask = Causal() if ctx.is_causal else Full()
        spec = AttentionSpec(mask, tuple(ctx.mods), norm).line() if mask is not None else ""
        announce(self.last_plan, spec or f"mask dense; mods [{len(ctx.mods)}]; {norm!r}")


def _explicit_reason(backend: str, ctx: ScoreContext, transform) -> str:
    """Why a call runs the materialised path outside the engine."""
    if backend == "math":
        return "model.attention.backend = 'math'"
    if ctx.need_weights:
        return "need_weights: the attention maps are returned"
    if transform is not None:
        on = getattr(transform, "on", "logits")
        return f"{type(transform).__name__} rewrites the T x T {on}"
    return "a score part forms the T x T matrix"


def _query_positions(ctx: ScoreContext, Tq: int, Tk: int, device) -> Tensor:
    """[Tq] absolute positions of the query rows (``ctx.q_pos``, else ``q_offset``.. for an
    engine context, else the last Tq of the Tk keys)."""
    if ctx.q_pos is not None:
        return ctx.q_pos
    start = ctx.q_offset if ctx.mask is not None else Tk - Tq
    return torch.arange(start, start + Tq, device=device)


def _explicit_allowed(ctx: ScoreContext, q_pos: Tensor, Tq: int, Tk: int, B: int, device):
    """[Tq, Tk] (or [B, 1, Tq, Tk]) bool: ``ctx.allowed``, the engine mask's dense form, or
    the causal / full pattern."""
    if ctx.allowed is not None:
        return ctx.allowed
    if ctx.mask is not None:
        return dense_allowed(ctx.mask, q_pos, torch.arange(Tk, device=device), B)
    allowed = torch.ones(Tq, Tk, dtype=torch.bool, device=device)
    return allowed.tril(Tk - Tq) if ctx.is_causal else allowed


def _apply_mods(scores: Tensor, mods: tuple, q_pos: Tensor) -> Tensor:
    """The score mods in order on [B, H, Tq, Tk] scores, FlexAttention's convention with
    broadcast index tensors (the explicit path's form of what the engine fuses)."""
    if not mods:
        return scores
    B, H, _, Tk = scores.shape
    dev = scores.device
    b = torch.arange(B, device=dev)[:, None, None, None]
    h = torch.arange(H, device=dev)[None, :, None, None]
    q_idx = q_pos.to(dev)[None, None, :, None]
    kv_idx = torch.arange(Tk, device=dev)[None, None, None, :]
    for mod in mods:
        scores = mod.score_mod(scores, b, h, q_idx, kv_idx)
    return scores


def _with_padding(
    allowed: Tensor | None, is_causal: bool, padding: Tensor, Tq: int, Tk: int
) -> Tensor:
    """[B, 1, Tq, Tk] bool: ``allowed`` (or the causal/full pattern) and the key is a real token."""
    if allowed is None:
        allowed = torch.ones(Tq, Tk, dtype=torch.bool, device=padding.device)
        if is_causal:
            allowed = allowed.tril(Tk - Tq)
    return allowed & padding[:, None, None, :]
