"""The materialised convolution of the attention image, shared by ``virtual_heads`` (its whole
computation) and ``virtual_heads_fused`` (attention maps, one-token decoding steps)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def convolve_scores(s: Tensor, weight: Tensor) -> Tensor:
    """[B, H, Tq, Tk] -> [B, H', Tq, Tk]: the causal 1-D convolution along the key axis (``weight``
    [H', H, K]) or the same-padded 2-D one over (query, key) (``weight`` [H', H, K, K])."""
    if weight.dim() == 3:
        B, H, Tq, Tk = s.shape
        K = weight.shape[-1]
        rows = s.permute(0, 2, 1, 3).reshape(B * Tq, H, Tk)
        # w[.., t] multiplies key j - t: flip so conv1d's cross-correlation reads left padding.
        out = F.conv1d(F.pad(rows, (K - 1, 0)), weight.flip(-1))
        return out.reshape(B, Tq, -1, Tk).permute(0, 2, 1, 3)
    return F.conv2d(s, weight, padding=weight.shape[-1] // 2)
