"""Virtual heads (seed 004) on the fused attention path: the same convolution of the attention
image as ``virtual_heads``, computed by ``F.scaled_dot_product_attention`` without the T x T map.

With ``s[h, i, j] = q_(h,i) . k_(h,j)`` (RoPE applied) the causal 1-D virtual head is
``s'[h', i, j] = sum_h sum_(t<K) w[h', h, t] s[h, i, j - t]``. The logits are linear in the keys,
so (``attnlab.model.virtual_fused``):

- ``mixing = "none"`` (w[h', h, t] = 0 for h != h'): ``s'[h, i, j] = q_(h,i) . khat_(h,j)``,
  ``khat_(h,j) = sum_t w[h, t] k_(h, j-t)``: ordinary attention with causally convolved keys, about
  the baseline's cost;
- ``mixing = "full"``: ``s'[h', i, j] = [q_(1,i) | ... | q_(H,i)] . [khat_(h',1,j) | ... |
  khat_(h',H,j)]``, ``khat_(h',h,j) = sum_t w[h', h, t] k_(h, j-t)``: attention of head width
  H * d_h, H x the QK^T FLOPs; ``mixing = "grouped"``: the same within groups of ``group_size``
  = G heads, G x the QK^T FLOPs;
- ``conv = "2d"`` (bidirectional encoders, odd K): shifted queries as well, width G * K * d_h;
  exact at the sequence ends and at padded tokens because q and k are zero there;
- ``on = "probs"``: attention over convolved values (one SDPA call; the causal form adds K - 1
  keys that return the near-diagonal probabilities), mask and renormalise, exact;
- ALiBi (causal): two extra q/k columns carry its bias ``m (j - i)`` through the convolution.

Same function as ``virtual_heads`` with the same (dense) weights; params H' * G * K (2-D:
H' * G * K^2). ``mixing`` defaults to "full", whose kernel has ``virtual_heads``' shape [H', H, K]
(the two kinds load each other's weights). Each forward is one attention call
(``virtual_fused.sdpa.attend``): torch's fused kernel takes one head width, so the narrower side is
zero-padded, except on CPU where a call whose widths differ more than 2x (mixed heads: G * d_h
against d_h) runs as query chunks of plain GEMMs recomputed in the backward pass. Memory O(T) per
head: no [B, H, T, T] tensor (a chunk holds at most 2^22 scores). Falls back to the materialised
path (``AttentionCore.explicit``) when attention maps are requested, with
``attention.backend = "math"``, and for a one-token decoding step (its single row of the map,
O(T_k * H')). Refused (config error): T5 relative buckets and the bidirectional ALiBi bias (not
bilinear in positions), masks other than causal/bidirectional (the convolution would read masked
scores), attention dropout with ``on = "probs"``. The KV cache holds the raw keys as for the
baseline; each forward convolves the keys it is given, so decoding equals the uncached forward.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from attnlab.base.errors import UserError
from attnlab.model.virtual_fused.geometry import Geometry
from attnlab.model.virtual_fused.image import convolve_scores
from attnlab.model.virtual_fused.keys import convolved_keys, stacked_queries
from attnlab.model.virtual_fused.probs import bidirectional_probs, causal_probs
from attnlab.model.virtual_fused.sdpa import attend
from attnlab.model.virtual_options import VirtualHeadsOptions
from attnlab.parts import Dims, Init, ScoreContext, ScorePart, WidthScaling, families, register
from attnlab.parts.tp import TPPlan


@register("score", "virtual_heads_fused")
class VirtualHeadsFused(ScorePart):
    """Virtual heads through fused attention (SDPA): no T x T map, O(T) memory."""

    param_label = "virtual_heads"
    cost = (
        "params H'*G*K (2-D: H'*G*K^2), G = 1 | group_size | H for mixing none | grouped | full; "
        "logits: QK^T over head width G*d_h (2-D: G*K*d_h), i.e. G x (G*K x) the baseline's; "
        "probs: P V over (H'*G/H)*(d_h+1) (2-D: x K) columns per head; memory O(T)"
    )
    needs_attention_matrix = False
    attention_maps_label = "virtual heads"

    class Options(VirtualHeadsOptions):
        mixing: Literal["none", "grouped", "full"] = Field(
            "full",
            description="none: each virtual head convolves one head (about the baseline's cost); "
            "grouped: heads mix in groups of group_size (group_size x QK^T); full: all heads mix "
            "(n_heads x QK^T), the function of kind='virtual_heads'",
        )
        group_size: int = Field(2, ge=1, description="grouped: heads mixed together")

        def group(self, n_heads: int) -> int:
            """G, the heads each virtual head mixes."""
            return {"none": 1, "full": n_heads}.get(self.mixing, self.group_size)

        def check(self, model) -> list[str]:
            out = super().check(model)
            H = model.attention.n_heads
            if self.conv == "2d" and self.kernel_size % 2 == 0:
                out.append(
                    f"model.score.conv='2d' needs an odd model.score.kernel_size (got "
                    f"{self.kernel_size}): the kernel is centred on each score"
                )
            G = self.group(H)
            n = self.n_virtual or H
            if H % G:
                out.append(f"model.score.group_size={G} must divide model.attention.n_heads={H}")
            elif n % (H // G):
                out.append(
                    f"model.score.n_virtual={n} must be a multiple of the {H // G} head groups "
                    f"(n_heads={H} / group size {G}); each group makes the same number of "
                    "virtual heads"
                )
            pos = _position(model)
            kind = model.position.kind
            if pos is not None and pos.logit_bias and pos.key_fold is None:
                out.append(
                    f"model.position.kind={kind!r} adds a logit bias that is not bilinear in the "
                    "positions, so it cannot be convolved with the keys; use "
                    "model.score.kind='virtual_heads' (materialised) or another position kind"
                )
            stacks = families.of(model).stacks(model)
            if pos is not None and pos.key_fold is not None and not all(s.causal for s in stacks):
                out.append(
                    f"model.position.kind={kind!r} folds its bias into the keys in a causal stack "
                    "only; kind='virtual_heads_fused' cannot convolve it in a bidirectional one. "
                    "Use model.score.kind='virtual_heads' (materialised) or a rotary position"
                )
            if not model.mask_class.plain:
                out.append(
                    f"model.mask.kind='{model.mask.kind}' hides scores the convolution "
                    "would read across the mask's edge; kind='virtual_heads_fused' takes the "
                    "causal or bidirectional (full) mask. Use model.score.kind='virtual_heads'"
                )
            if self.on == "probs" and model.attention.dropout > 0:
                out.append(
                    "model.score.on='probs' in kind='virtual_heads_fused' cannot drop attention "
                    "probabilities (it reads them back out of the fused call); set "
                    "model.attention.dropout=0 or use on='logits'"
                )
            return out

    @classmethod
    def heads_out(cls, opts: Options, dims: Dims) -> int:
        return opts.heads_out(dims)

    @classmethod
    def param_count(cls, opts: Options, dims: Dims) -> int:
        taps = opts.kernel_size ** (1 if opts.conv == "1d" else 2)
        return opts.heads_out(dims) * opts.group(dims.n_heads) * taps

    def __init__(self, opts: Options, dims: Dims) -> None:
        super().__init__(opts, dims)
        H = dims.n_heads
        self.on, self.conv, self.mixing = opts.on, opts.conv, opts.mixing
        self.geo = Geometry(
            H,
            dims.n_kv_heads,
            self.heads_out(opts, dims),
            opts.group(H),
            opts.kernel_size,
            opts.conv,
        )
        self.head_dim = dims.head_dim
        model = dims.model
        pos = _position(model) if model is not None else None
        #: the position part's bias folded into extra q/k columns (None: no bias to fold)
        self.fold = pos.key_fold if pos is not None and pos.logit_bias else None
        self.fold_width = pos.key_fold_width if self.fold is not None else 0
        #: FLOP accounting only: a causal LM's output stack is causal
        self.causal = model is None or families.of(model).causal_lm
        self.weight = nn.Parameter(torch.zeros(self.geo.weight_shape()))
        self._identity()

    @torch.no_grad()
    def _identity(self) -> None:
        """w = identity: virtual head gV + v copies head gG + v (v < G), ordinary attention."""
        self.weight.zero_()
        geo, c = self.geo, self.geo.K // 2
        for h in range(geo.H_out):
            local = h % geo.V
            if local < geo.G:
                if geo.conv == "1d":
                    self.weight[h, local, 0] = 1.0
                else:
                    self.weight[h, local, c, c] = 1.0

    def init_weights(self, init: Init) -> None:
        self._identity()

    def width_scaling(self) -> dict[str, WidthScaling]:
        """µP: the kernel mixes heads (fan-in: the heads read, dimension 1), and its identity
        init is right at every width, so only its learning rate scales."""
        return {"weight": WidthScaling("hidden", fan_in_dim=1, keep_init=True)}

    def tp_plan(self) -> TPPlan:
        return TPPlan.whole("its kernel mixes all H heads into each of the H' virtual heads")

    def dense_weight(self) -> Tensor:
        """The weight as ``virtual_heads``' [H', H, K] (2-D: [H', H, K, K])."""
        return self.geo.dense(self.weight)

    # -------------------------------------------------------------------------------- accounting
    def call_widths(self) -> tuple[int, int, int]:
        """(query/key width, value width, heads) of the one fused attention call per forward."""
        geo, d = self.geo, self.head_dim
        n_alpha, dq, e = len(geo.alphas), d + self.fold_width, d + 1
        if self.on == "logits":
            return geo.G * n_alpha * dq, d, geo.H_out
        if self.causal:
            R = geo.K - 1
            return dq + R, geo.V * e + R, geo.H
        return dq, geo.V * n_alpha * e, geo.H

    def extra_flops(self, seq_len: int) -> int:
        """Forward FLOPs per token of the algorithm beyond the 4 T d_h H' the model counts for
        attention: QK^T and P V at the call's widths plus the key (or value) convolution. Zero
        columns a kernel may pad the narrower side with (``virtual_fused.sdpa``) are not
        counted; ``notes`` states how the call runs."""
        geo, T = self.geo, seq_len
        qk, v, heads = self.call_widths()
        conv = 2 * geo.H_out * geo.G * len(geo.alphas) * len(geo.betas)
        conv *= qk // geo.G // len(geo.alphas) if self.on == "logits" else self.head_dim + 1
        return 2 * T * (qk + v) * heads + conv - 4 * T * self.head_dim * geo.H_out

    def notes(self) -> list[str]:
        geo, d = self.geo, self.head_dim
        qk, v, heads = self.call_widths()
        ratio = qk * heads / (d * geo.H_out), v * heads / (d * geo.H_out)
        how = ""
        if max(qk, v) > 2 * min(qk, v):
            how = (
                "; widths this different run on CPU as query chunks of plain GEMMs, recomputed "
                f"in the backward pass (elsewhere zero-padded to width {max(qk, v)})"
            )
        elif qk != v:
            how = f"; the fused kernel takes one width: the narrower side is zero-padded to {max(qk, v)}"
        return [
            f"score: fused virtual heads (on={self.on}, conv={self.conv}, mixing={self.mixing}, "
            f"G={geo.G}, K={geo.K}, H'={geo.H_out}): one attention call over {heads} heads, QK^T "
            f"at width {qk} ({ratio[0]:.3g}x the baseline's QK^T FLOPs), P V at width {v} "
            f"({ratio[1]:.3g}x){how}; O(T) memory, no T x T map"
        ]

    # ----------------------------------------------------------------------------------- forward
    def transform(self, s: Tensor, allowed: Tensor) -> Tensor:
        """The materialised form (maps, one-token decoding): ``virtual_heads``' convolution."""
        return convolve_scores(s, self.dense_weight())

    def forward(self, q: Tensor, k: Tensor, v: Tensor, core, ctx: ScoreContext):
        Tq, Tk = q.shape[2], k.shape[2]
        if ctx.need_weights or core.backend == "math" or Tq == 1 < Tk:
            return core.explicit(q, k, v, ctx, transform=self)
        if ctx.bias is not None and self.fold is None:
            raise UserError(
                "virtual_heads_fused was given a logit bias it cannot convolve; only a position "
                "part that declares key_fold (causal ALiBi) is folded into the keys"
            )
        offset = Tk - Tq
        causal = ctx.is_causal or ctx.allowed is not None or offset > 0
        if ctx.padding is not None:
            keep = ctx.padding.to(q.dtype)[:, None, :, None]
            q, k = q * keep[:, :, offset:], k * keep
        if self.fold is not None:
            q, k = self.fold(q, k, core.scale, offset)
        if self.on == "probs":
            if causal:
                return causal_probs(q, k, v, self.weight, self.geo, core, offset), None
            return bidirectional_probs(q, k, v, self.weight, self.geo, core, ctx), None
        Q = stacked_queries(q * core.scale, self.geo)  # scaled before the H'-fold stacking
        Khat = convolved_keys(k, self.weight, self.geo)
        sctx = ScoreContext(ctx.allowed, ctx.is_causal, None, False, ctx.padding)
        return attend(core, Q, Khat, self.geo.value_heads(v), sctx, scale=1.0), None


def _position(model):
    """The class of ``model``'s position part (None: no positions)."""
    from attnlab.parts import registry

    spec = registry.get("position", model.position.kind)
    return None if spec.kind == "none" else spec.cls
