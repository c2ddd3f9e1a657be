"""Identity head with data-dependent head weights (seed 004, "No MLP/Residuals").

Beside the H attention heads sits one more head whose attention matrix is I: it passes each token's
own value vector v_id = u W_vid (d -> d_h) on, unmixed. A small linear layer gives per-token head
weights w = u W_w + b over the H + 1 heads, multiplied into the head outputs before head mixing.
At init W_w = 0 and b = e_(H+1): all weight on the identity head, so every layer is token-wise and
the network starts as an MLP-only one. Params d*d_h + (d + 1)(H + 1); no K/V-cache cost.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.model.linear import Linear


class IdentityHead(nn.Module):
    """heads [B, H, T, d_h], u [B, T, d] -> weighted [B, T, (H + 1) * d_h]."""

    def __init__(self, d: int, n_heads: int, head_dim: int, bias: bool) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.w_vid = Linear(d, head_dim, bias=bias)
        self.head_weights = Linear(d, n_heads + 1, bias=True)
        self.head_weights.skip_init = True
        self.reset_head_weights()

    @torch.no_grad()
    def reset_head_weights(self) -> None:
        self.head_weights.weight.zero_()
        self.head_weights.bias.zero_()
        self.head_weights.bias[-1] = 1.0

    def forward(self, u: Tensor, heads: Tensor) -> Tensor:
        B, H, T, dh = heads.shape
        v_id = self.w_vid(u).unsqueeze(2)  # [B, T, 1, dh]
        allh = torch.cat([heads.transpose(1, 2), v_id], dim=2)  # [B, T, H+1, dh]
        w = self.head_weights(u).unsqueeze(-1)  # [B, T, H+1, 1]
        return (allh * w).reshape(B, T, (H + 1) * dh)
