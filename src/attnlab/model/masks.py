"""Which keys each query may see, as a boolean [Tq, Tk] matrix over absolute positions.

causal: j <= i.  bidirectional: all.  prefix (prefix-LM): j <= i or j < P.
sliding: 0 <= i - j < W (causal) or |i - j| < W (bidirectional).
local_global (Longformer/BigBird-style): the sliding window, plus global tokens (the first G, and
every k-th) that see and are seen by all (in a causal model only earlier positions).
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.config import AttentionConfig


def allowed_keys(cfg: AttentionConfig, q_pos: Tensor, k_pos: Tensor, causal: bool) -> Tensor:
    """Boolean [Tq, Tk]: True where query i may attend to key j."""
    i, j = q_pos[:, None], k_pos[None, :]
    past = j <= i
    if cfg.mask == "bidirectional":
        return torch.ones(i.shape[0], j.shape[1], dtype=torch.bool, device=q_pos.device)
    if cfg.mask == "causal":
        return past
    if cfg.mask == "prefix":
        return past | (j < cfg.prefix_len)
    near = ((i - j) < cfg.window) & past if causal else (i - j).abs() < cfg.window
    if cfg.mask == "sliding":
        return near

    # local_global
    def is_global(p: Tensor) -> Tensor:
        g = p < cfg.n_global
        if cfg.global_every:
            g = g | (p % cfg.global_every == 0)
        return g

    seen = near | is_global(j) | is_global(i)
    return seen & past if causal else seen
