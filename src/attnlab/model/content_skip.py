"""Content skip (seed 000): out = x + attn_out + W_skip x~.

W_skip: d x d, no bias, N(0, 1e-4) so the block starts as the baseline; its magnitude is the only
gate (no separate alpha). Params d^2 per layer (7.08M on Pythia-160M); FLOPs 2d^2 per token; no
K/V-cache cost. ``norm()`` is the per-layer Frobenius norm the paper plots (its Figure 2).
"""

from __future__ import annotations

from torch import Tensor, nn

from attnlab.config import ContentSkipConfig
from attnlab.model.linear import Linear


class ContentSkip(nn.Module):
    """x~ -> W_skip x~, added to the block output beside the attention branch."""

    def __init__(self, d: int, cfg: ContentSkipConfig) -> None:
        super().__init__()
        self.w_skip = Linear(d, d, bias=False)
        self.w_skip.init_std = cfg.init_std

    def forward(self, x_tilde: Tensor) -> Tensor:
        return self.w_skip(x_tilde)

    def norm(self) -> float:
        return float(self.w_skip.weight.detach().float().norm())
