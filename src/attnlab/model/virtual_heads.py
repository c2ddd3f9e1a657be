"""Virtual heads (seed 004): a convolution over the T x T x H attention image, heads as channels,
makes H' new heads, a learned local rewiring of the attention graph.

- conv "1d" (causal models): for each query row i, along the key axis,
  s'[h', i, j] = sum_h sum_(t<K) w[h', h, t] * s[h, i, j - t], so key j only reads keys <= j of the
  same row and nothing from the future can leak. Params H*H'*K.
- conv "2d" (bidirectional models only): a K x K convolution over (query, key) with same padding.
- ``on = "logits"``: transform the masked logits, then mask and softmax; ``on = "probs"``: softmax,
  transform, mask and renormalise.
Initialised to the identity (w[h, h, 0] = 1), so training starts from ordinary attention.
Cost: this variant needs the full [B, H, T, T] matrix, so it never uses a flash kernel:
O(T^2 * H) memory and 2*K*H*H'*T^2 extra FLOPs per sequence.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.config import VirtualHeadsConfig


class VirtualHeads(nn.Module):
    """[B, H, Tq, Tk] scores -> [B, H', Tq, Tk] scores."""

    def __init__(self, n_heads: int, cfg: VirtualHeadsConfig) -> None:
        super().__init__()
        self.on, self.conv, self.k = cfg.on, cfg.conv, cfg.kernel_size
        n_out = cfg.n_virtual or n_heads
        shape = (n_out, n_heads, self.k) if cfg.conv == "1d" else (n_out, n_heads, self.k, self.k)
        self.weight = nn.Parameter(torch.zeros(shape))
        self.weight.skip_init = True
        with torch.no_grad():
            for h in range(min(n_out, n_heads)):
                if cfg.conv == "1d":
                    self.weight[h, h, 0] = 1.0
                else:
                    self.weight[h, h, self.k // 2, self.k // 2] = 1.0

    def forward(self, s: Tensor, allowed: Tensor) -> Tensor:
        B, H, Tq, Tk = s.shape
        if self.conv == "1d":
            rows = s.permute(0, 2, 1, 3).reshape(B * Tq, H, Tk)
            # w[.., t] multiplies key j - t: flip so conv1d's cross-correlation reads left padding.
            out = F.conv1d(F.pad(rows, (self.k - 1, 0)), self.weight.flip(-1))
            return out.reshape(B, Tq, -1, Tk).permute(0, 2, 1, 3)
        pad = self.k // 2
        return F.conv2d(s, self.weight, padding=pad)
