"""Head readouts: how the heads' outputs are laid out for the mixer.

- heads (baseline): concatenate the H' head outputs, [B,H',T,d_h] -> [B,T,H'*d_h]. No params.
- identity_head (seed 004, "No MLP/Residuals"): beside the H' attention heads sits one more head
  whose attention matrix is I: it passes each token's own value vector v_id = u W_vid (d -> d_h)
  on, unmixed. A small linear layer gives per-token head weights w = u W_w + b over the H' + 1
  heads, multiplied into the head outputs before head mixing. At init W_w = 0 and b = e_(H'+1):
  all weight on the identity head, so every layer is token-wise and the network starts as an
  MLP-only one. Params d*d_h (+ d_h) + (d + 1)(H' + 1); no K/V-cache cost.

  Cost per token: 2 d (d_h + H' + 1) FLOPs for [v_id | w] (one matmul over the stacked rows of
  W_vid and W_w) and (H' + 1) d_h multiplies for the weighting, done in place on the
  concatenation [heads | v_id] with its gradient written out by hand (the backward pass keeps the
  heads, v_id and w, not a second [B, T, H' + 1, d_h] tensor).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from attnlab.model.linear import Linear
from attnlab.parts import Dims, Init, PartOptions, ReadoutPart, register
from attnlab.parts.tp import TPPlan


@register("readout", "heads")
class ConcatHeads(ReadoutPart):
    """o = [head_1 | ... | head_H'] (the baseline's readout)."""

    cost = "params 0; FLOPs 0"

    @classmethod
    def param_count(cls, opts: PartOptions, dims: Dims) -> int:
        return 0

    def tp_plan(self) -> TPPlan:
        return TPPlan()  # concatenates whatever heads it is given: the rank's own

    def forward(self, u: Tensor, heads: Tensor) -> Tensor:
        B, _, T, _ = heads.shape
        return heads.transpose(1, 2).reshape(B, T, -1)


@register("readout", "identity_head")
class IdentityHead(ReadoutPart):
    """heads [B, H', T, d_h], u [B, T, d] -> weighted [B, T, (H' + 1) * d_h]."""

    param_label = "identity_head"
    cost = "params d*d_h + (d+1)(H'+1); FLOPs 2*d*d_h + 2*d*(H'+1) per token; cache 0"
    attention_maps_label = "identity head"

    @classmethod
    def width(cls, opts: PartOptions, dims: Dims) -> int:
        return (dims.heads_out + 1) * dims.head_dim

    @classmethod
    def param_count(cls, opts: PartOptions, dims: Dims) -> int:
        d, dh, n = dims.d_model, dims.head_dim, dims.heads_out + 1
        return d * dh + (dh if dims.bias else 0) + (d + 1) * n

    def __init__(self, opts: PartOptions, dims: Dims) -> None:
        super().__init__(opts, dims)
        self.n_heads = dims.heads_out
        self.w_vid = Linear(dims.d_model, dims.head_dim, bias=dims.bias)
        self.head_weights = Linear(dims.d_model, self.n_heads + 1, bias=True)
        self._last: Tensor | None = None
        self._train_mean: Tensor | None = None

    @torch.no_grad()
    def tp_plan(self) -> TPPlan:
        return TPPlan.whole("its per-token weights w span all H' + 1 heads (one linear layer)")

    def init_weights(self, init: Init) -> None:
        nn.init.normal_(self.w_vid.weight, 0.0, init.std)
        if self.w_vid.bias is not None:
            self.w_vid.bias.zero_()
        self.head_weights.weight.zero_()
        self.head_weights.bias.zero_()
        self.head_weights.bias[-1] = 1.0

    def forward(self, u: Tensor, heads: Tensor) -> Tensor:
        dh = heads.shape[-1]
        vid, hw = self.w_vid, self.head_weights
        b_vid = vid.bias if vid.bias is not None else hw.bias.new_zeros(dh)
        both = F.linear(u, torch.cat([vid.weight, hw.weight]), torch.cat([b_vid, hw.bias]))
        v_id, w = both[..., :dh], both[..., dh:]  # [B, T, dh], [B, T, H+1]
        if self.recording:
            self._last = w.detach()
        if self.training:  # a [H'+1] mean, read at the loop's log steps (train_stats)
            self._train_mean = w.detach().float().mean(dim=tuple(range(w.dim() - 1)))
        return weighted_heads(heads, v_id, w)

    def forward_stats(self) -> dict[str, Tensor]:
        if self._last is None:
            return {}
        return {"head_weights": self._last[0].float().mean(0)}

    def train_stats(self) -> dict[str, float | Tensor]:
        if self._train_mean is None:
            return {}
        return {"identity_weight": self._train_mean[-1]}

    @classmethod
    def train_stats_doc(cls) -> dict[str, str]:
        return {
            "identity_weight": (
                "Mean weight on the identity head over the last training batch's tokens (1 at "
                "initialisation: the network starts MLP-only; it falls as the layer learns to "
                "use its attention heads)"
            )
        }

    def token_stats(self) -> dict[str, Tensor]:
        if self._last is None:
            return {}
        return {"head_weights": self._last[0].float()}

    @classmethod
    def token_stats_doc(cls) -> dict[str, tuple[str, list[str] | None]]:
        return {
            "head_weights": (
                "Identity-head weights per token over the attention heads and the identity head",
                ["identity"],
            )
        }

    @classmethod
    def forward_stats_doc(cls) -> dict[str, tuple[str, list[str] | None]]:
        return {
            "head_weights": (
                "Identity-head weights (data-dependent weights over the H attention heads and "
                "the identity head, averaged over the sequence's tokens; at initialisation all "
                "weight is on the identity head)",
                ["identity"],
            )
        }


class _WeightedHeads(torch.autograd.Function):
    """o[b,t,h] = w[b,t,h] head_h[b,t] (h < H), o[b,t,H] = w[b,t,H] v_id[b,t]; flattened."""

    @staticmethod
    def forward(heads: Tensor, v_id: Tensor, w: Tensor) -> Tensor:
        B, H, T, dh = heads.shape
        out = torch.cat([heads.transpose(1, 2), v_id.unsqueeze(2)], dim=2)  # [B, T, H+1, dh]
        return out.mul_(w.unsqueeze(-1)).view(B, T, (H + 1) * dh)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(*inputs)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        heads, v_id, w = ctx.saved_tensors
        B, H, T, dh = heads.shape
        g = grad.view(B, T, H + 1, dh)
        g_heads, g_id = g[:, :, :H], g[:, :, H]
        d_heads = (g_heads * w[..., :H, None]).transpose(1, 2)
        d_vid = g_id * w[..., H:]
        d_w = torch.cat(
            [(g_heads * heads.transpose(1, 2)).sum(-1), (g_id * v_id).sum(-1, keepdim=True)], -1
        )
        return d_heads, d_vid, d_w


def weighted_heads(heads: Tensor, v_id: Tensor, w: Tensor) -> Tensor:
    """heads [B, H, T, d_h], v_id [B, T, d_h], w [B, T, H+1] -> [w_h head_h | ... | w_H v_id]
    [B, T, (H+1) d_h]: the concatenation weighted in place, with the gradient written out (it
    needs the heads, v_id and w, not the concatenation, which autograd would keep)."""
    return _WeightedHeads.apply(heads, v_id, w)
