"""Virtual heads (seed 004): a convolution over the T x T x H attention image, heads as channels,
makes H' new heads, a learned local rewiring of the attention graph.

- conv "1d" (causal models): for each query row i, along the key axis,
  s'[h', i, j] = sum_h sum_(t<K) w[h', h, t] * s[h, i, j - t], so key j only reads keys <= j of the
  same row and nothing from the future can leak. Params H*H'*K.
- conv "2d" (bidirectional encoders only): a K x K convolution over (query, key), same padding.
- ``on = "logits"``: transform the masked logits, then mask and softmax; ``on = "probs"``: softmax,
  transform, mask and renormalise.
Initialised to the identity (w[h, h, 0] = 1), so training starts from ordinary attention.
Cost: this part reads the full [B, H, T, T] matrix, so it never uses a fused (flash) kernel:
O(T^2 * H) memory and 2*K*H*H'*T (1-D) extra FLOPs per token.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.model.virtual_fused.image import convolve_scores
from attnlab.model.virtual_options import VirtualHeadsOptions
from attnlab.parts import Dims, Init, ScoreContext, ScorePart, WidthScaling, register
from attnlab.parts.tp import TPPlan


@register("score", "virtual_heads")
class VirtualHeads(ScorePart):
    """[B, H, Tq, Tk] scores -> [B, H', Tq, Tk] scores, on the materialised matrix."""

    param_label = "virtual_heads"
    cost = "params H*H'*K (2-D: H*H'*K^2); FLOPs 2*K*H*H'*T per token; memory O(T^2 * H)"
    needs_attention_matrix = True
    attention_maps_label = "virtual heads"

    Options = VirtualHeadsOptions

    @classmethod
    def heads_out(cls, opts: VirtualHeadsOptions, dims: Dims) -> int:
        return opts.heads_out(dims)

    @classmethod
    def param_count(cls, opts: VirtualHeadsOptions, dims: Dims) -> int:
        taps = opts.kernel_size ** (1 if opts.conv == "1d" else 2)
        return opts.heads_out(dims) * dims.n_heads * taps

    @classmethod
    def activation_elements(cls, opts: VirtualHeadsOptions, dims: Dims, seq_len: int) -> int:
        """The zero-padded score rows the convolution reads, H (T + K - 1) per token (1-D;
        2-D pads both axes: H (T + K - 1)^2 / T), twice (the padded copy kept for backward and
        the convolution kernel's working copy of its input), and its H' T outputs."""
        T, K, H = seq_len, opts.kernel_size, dims.n_heads
        padded = H * (T + K - 1) if opts.conv == "1d" else H * (T + K - 1) ** 2 // max(T, 1)
        return 2 * padded + opts.heads_out(dims) * T

    def __init__(self, opts: VirtualHeadsOptions, dims: Dims) -> None:
        super().__init__(opts, dims)
        self.on, self.conv, self.k = opts.on, opts.conv, opts.kernel_size
        n_out, H = self.heads_out(opts, dims), dims.n_heads
        shape = (n_out, H, self.k) if opts.conv == "1d" else (n_out, H, self.k, self.k)
        self.weight = nn.Parameter(torch.zeros(shape))
        self._identity()

    @torch.no_grad()
    def _identity(self) -> None:
        self.weight.zero_()
        n_out, H = self.weight.shape[:2]
        for h in range(min(n_out, H)):
            if self.conv == "1d":
                self.weight[h, h, 0] = 1.0
            else:
                self.weight[h, h, self.k // 2, self.k // 2] = 1.0

    def init_weights(self, init: Init) -> None:
        self._identity()

    def width_scaling(self) -> dict[str, WidthScaling]:
        """µP: the kernel mixes heads (fan-in: the heads read, dimension 1), and its identity
        init is right at every width, so only its learning rate scales."""
        return {"weight": WidthScaling("hidden", fan_in_dim=1, keep_init=True)}

    def tp_plan(self) -> TPPlan:
        return TPPlan.whole("its kernel mixes all H heads into each of the H' virtual heads")

    def extra_flops(self, seq_len: int) -> int:
        return 2 * self.weight.numel() * seq_len

    def transform(self, s: Tensor, allowed: Tensor) -> Tensor:
        return convolve_scores(s, self.weight)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, core, ctx: ScoreContext):
        return core.explicit(q, k, v, ctx, transform=self)
