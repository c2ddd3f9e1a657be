"""The attention engine: one call, any mask, mods and normaliser, on the fastest exact path.

``AttentionEngine(spec, options)(q, k, v, ...)`` with q [B, H, Tq, d], k [B, H_kv, Tk, d], v
[B, H_kv, Tk, d_v] (H_kv divides H: GQA) -> (out [B, H, Tq, d_v], weights [B, H, Tq, Tk] or
None). Query row i sits at position ``q_offset + i`` (the cached prefix while decoding), key j
at j; ``kv_valid`` [B, Tk] marks the real keys of a right-padded batch. The result is, on every
path, the plain definition: s = scale q . k, the mods in order, the mask, the normaliser,
weights @ v (a query with no allowed key gets 0). ``plan.py`` says how the path is chosen.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from attnlab.base.errors import UserError
from attnlab.base.section import Section
from attnlab.model.engine.band import band_plan, band_width, run_banded
from attnlab.model.engine.centred import centred_groups, run_centred
from attnlab.model.engine.contracts import Mask, Normaliser, ScoreMod, mod_parameters
from attnlab.model.engine.denormals import flush_denormals
from attnlab.model.engine.flex import BlockMaskCache, flex_attend
from attnlab.model.engine.folds import Folded, columns, fold
from attnlab.model.engine.grouped import Call, run_layout, with_columns
from attnlab.model.engine.layout import Layout, build_layout, dense_layout
from attnlab.model.engine.masks import Causal, Padded
from attnlab.model.engine.normalisers import Softmax
from attnlab.model.engine.plan import Plan, Situation, announce, choose


class EngineOptions(Section):
    """How the engine may run (defaults: choose by itself)."""

    path: Literal["auto", "sdpa", "block_sparse", "flex", "explicit"] = Field(
        "auto", description="force one path (refused when it cannot run the call)"
    )
    block_size: int = Field(128, ge=1, description="rows and keys per block of the layout")
    flex_compile: bool = Field(True, description="compile flex_attention (else: eager reference)")
    flex_cpu_inference: bool = Field(
        False, description="run flex on CPU without grad (compiles for minutes first)"
    )
    fold_tolerance: float = Field(
        2e-5, ge=0, description="largest estimated logit rounding of a bias folded as columns"
    )
    flush_denormal: bool = Field(
        True, description="on CPU, flush float32 denormals once a call declares a score mod"
    )


@dataclass(frozen=True)
class AttentionSpec:
    """What a layer's attention is: a mask, score mods in order, a normaliser."""

    mask: Mask = field(default_factory=Causal)
    mods: tuple[ScoreMod, ...] = ()
    normaliser: Normaliser = field(default_factory=Softmax)

    def line(self) -> str:
        mods = ", ".join(
            repr(m) if not isinstance(m, nn.Module) else type(m).__name__ for m in self.mods
        )
        return f"mask {self.mask!r}; mods [{mods}]; {self.normaliser!r}"


class AttentionEngine:
    """Runs one :class:`AttentionSpec`; ``last_plan`` is the path the last call took."""

    def __init__(self, spec: AttentionSpec, options: EngineOptions | None = None) -> None:
        self.spec, self.options = spec, options or EngineOptions()
        self.last_plan: Plan | None = None
        self._layouts: OrderedDict = OrderedDict()
        self._block_masks = BlockMaskCache()

    def __call__(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        scale: float | None = None,
        q_offset: int = 0,
        kv_valid: Tensor | None = None,
        need_weights: bool = False,
        dropout: float = 0.0,
    ) -> tuple[Tensor, Tensor | None]:
        _check_shapes(q, k, v, kv_valid)
        Tq, d, Tk = q.shape[2], q.shape[3], k.shape[2]
        mask = self.spec.mask if kv_valid is None else Padded(self.spec.mask, kv_valid)
        call = Call(
            mask=mask.fit(q_offset + Tq, Tk, q.device),
            mods=self.spec.mods,
            folded=fold(self.spec.mods),
            normaliser=self.spec.normaliser,
            scale=1.0 / math.sqrt(d) if scale is None else scale,
            q_offset=q_offset,
            dropout=dropout,
            tol=self.options.fold_tolerance,
        )
        dense = None if kv_valid is not None else call.mask.dense(Tq, Tk, q_offset)
        situation = Situation(
            q.device.type,
            self._grad(q, k, v),
            need_weights,
            dense,
            dropout,
            self.options.flex_cpu_inference,
        )
        plan = choose(call.folded, call.normaliser, situation, self.options.path)
        if self.options.flush_denormal and q.device.type == "cpu" and not call.folded.trivial:
            flush_denormals()
        out, weights = None, None
        auto_causal = plan.path == "block_sparse" and dense == "causal"
        band = band_width(call, q, Tk) if auto_causal and self.options.path == "auto" else None
        if band is not None:
            plan, out = band_plan(call, band), run_banded(q, k, v, call, band)
        if plan.path == "sdpa":
            out = dense_sdpa(q, k, v, dense, call)
            if out is None:
                plan, out = self._centred(q, k, v, call, dense)
        if plan.path == "flex":
            out = flex_attend(q, k, v, call, self.options.flex_compile, self._block_masks)
        elif out is None:
            if need_weights:
                layout = dense_layout(Tq, Tk, q.device)
            else:
                layout = self._layout(call.mask, q, Tk, q_offset)
            out, weights = run_layout(q, k, v, layout, call, explicit=plan.path == "explicit")
            weights = weights[:, 0] if need_weights else None
        announce(plan, self.spec.line())
        self.last_plan = plan
        return out, weights

    def _centred(self, q, k, v, call: Call, dense: str) -> tuple[Plan, Tensor | None]:
        """A folded bias too long for one call: SDPA per group of rows, each centred on its
        own (``centred.py``), where it runs; else the block-sparse path, centred per block."""
        Tk = k.shape[2]
        why = f"a folded bias would round more than fold_tolerance in one {q.dtype} call at "
        groups = centred_groups(call, q, Tk) if dense == "causal" else None
        if groups is None:
            return Plan("block_sparse", why + f"Tk={Tk}; centred per block"), None
        rows = groups[0][1] - groups[0][0]
        how = f"Tk={Tk}; is_causal SDPA per group of {rows} rows centred on it, merged by lse"
        return Plan("sdpa", why + how), run_centred(q, k, v, call, groups)

    def _grad(self, q: Tensor, k: Tensor, v: Tensor) -> bool:
        """Whether this call builds a graph (inputs or a mod's parameters need grad)."""
        if not torch.is_grad_enabled():
            return False
        params = [p for m in self.spec.mods for p in mod_parameters(m)]
        return any(t.requires_grad for t in (q, k, v, *params))

    def _layout(self, mask: Mask, q: Tensor, kv_len: int, q_offset: int) -> Layout:
        """The cached layout of ``mask`` at this shape (the last 8 kept)."""
        B, H, Tq, _ = q.shape
        block = mask.block_size or self.options.block_size
        key = (mask.token(), B if mask.uses_batch else None, Tq, kv_len, q_offset, block)
        if key not in self._layouts:
            self._layouts[key] = build_layout(mask, Tq, kv_len, q_offset, block, B, H, q.device)
            if len(self._layouts) > 8:
                self._layouts.popitem(last=False)
        self._layouts.move_to_end(key)
        return self._layouts[key]


def dense_sdpa(
    q: Tensor, k: Tensor, v: Tensor, dense: str, call: Call, centre: int | None = None
) -> Tensor | None:
    """Path a: one SDPA call, no mask or ``is_causal``, mods folded into q and k (None when a
    folded bias would round more than ``call.tol`` at this length; ``centre``: the position
    the columns are centred on, default Tk // 2). With nothing declared this is exactly
    ``AttentionCore.sdpa``'s call, so the baseline is bit-identical."""
    B, H, Tq, _ = q.shape
    gqa = k.shape[1] != H
    is_causal = dense == "causal"
    folded: Folded = call.folded
    if not folded.trivial:
        q_pos = (call.q_offset + torch.arange(Tq, device=q.device))[None]
        kv_pos = torch.arange(k.shape[2], device=q.device)[None]
        centre = torch.tensor([k.shape[2] // 2 if centre is None else centre], device=q.device)
        cols, refused = columns(
            folded, H, q_pos, kv_pos, centre, call.scale, True, q.dtype, call.tol
        )
        if refused:
            return None
        if folded.gain is not None:
            q = q * folded.gain.to(q.dtype).view(1, H, 1, 1)
        if cols is not None:
            dv = v.shape[-1]
            q, k, v = with_columns(q, k, v, cols, B, k.shape[1])
            out = F.scaled_dot_product_attention(
                q,
                k,
                v,
                dropout_p=call.dropout,
                is_causal=is_causal,
                scale=call.scale,
                enable_gqa=gqa,
            )
            return out[..., :dv]
    return F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=None,
        dropout_p=call.dropout,
        is_causal=is_causal,
        scale=call.scale,
        enable_gqa=gqa,
    )


def _check_shapes(q: Tensor, k: Tensor, v: Tensor, kv_valid: Tensor | None) -> None:
    """A clear error for shapes the engine cannot attend over."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise UserError("attention takes q, k, v as [B, H, T, d] tensors")
    B, H, _, d = q.shape
    if k.shape[0] != B or v.shape[:3] != k.shape[:3] or k.shape[-1] != d:
        raise UserError(
            f"attention shapes do not match: q {tuple(q.shape)}, k {tuple(k.shape)}, v "
            f"{tuple(v.shape)} (k and v share B, H_kv and T; q and k share d)"
        )
    if H % k.shape[1]:
        raise UserError(f"{k.shape[1]} key heads must divide the {H} query heads (GQA)")
    if kv_valid is not None and tuple(kv_valid.shape) != (B, k.shape[2]):
        raise UserError(f"kv_valid is {tuple(kv_valid.shape)}, not [B, Tk] = [{B}, {k.shape[2]}]")
