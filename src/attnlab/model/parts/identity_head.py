"""Head readouts: how the heads' outputs are laid out for the mixer.

- heads (baseline): concatenate the H' head outputs, [B,H',T,d_h] -> [B,T,H'*d_h]. No params.
- identity_head (seed 004, "No MLP/Residuals"): beside the H' attention heads sits one more head
  whose attention matrix is I: it passes each token's own value vector v_id = u W_vid (d -> d_h)
  on, unmixed. A small linear layer gives per-token head weights w = u W_w + b over the H' + 1
  heads, multiplied into the head outputs before head mixing. At init W_w = 0 and b = e_(H'+1):
  all weight on the identity head, so every layer is token-wise and the network starts as an
  MLP-only one. Params d*d_h (+ d_h) + (d + 1)(H' + 1); no K/V-cache cost.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.model.linear import Linear
from attnlab.parts import Dims, Init, PartOptions, ReadoutPart, register


@register("readout", "heads")
class ConcatHeads(ReadoutPart):
    """o = [head_1 | ... | head_H'] (the baseline's readout)."""

    cost = "params 0; FLOPs 0"

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

    def __init__(self, opts: PartOptions, dims: Dims) -> None:
        super().__init__(opts, dims)
        self.n_heads = dims.heads_out
        self.w_vid = Linear(dims.d_model, dims.head_dim, bias=dims.bias)
        self.head_weights = Linear(dims.d_model, self.n_heads + 1, bias=True)
        self._last: Tensor | None = None

    @torch.no_grad()
    def init_weights(self, init: Init) -> None:
        nn.init.normal_(self.w_vid.weight, 0.0, init.std)
        if self.w_vid.bias is not None:
            self.w_vid.bias.zero_()
        self.head_weights.weight.zero_()
        self.head_weights.bias.zero_()
        self.head_weights.bias[-1] = 1.0

    def forward(self, u: Tensor, heads: Tensor) -> Tensor:
        B, H, T, dh = heads.shape
        v_id = self.w_vid(u).unsqueeze(2)  # [B, T, 1, dh]
        allh = torch.cat([heads.transpose(1, 2), v_id], dim=2)  # [B, T, H+1, dh]
        w = self.head_weights(u)  # [B, T, H+1]
        if self.recording:
            self._last = w.detach()
        return (allh * w.unsqueeze(-1)).reshape(B, T, (H + 1) * dh)

    def forward_stats(self) -> dict[str, Tensor]:
        if self._last is None:
            return {}
        return {"head_weights": self._last[0].float().mean(0)}

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
