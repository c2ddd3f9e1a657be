"""Which keys each query may see, as a boolean [Tq, Tk] matrix over absolute positions.

causal: j <= i.  bidirectional: all.  prefix (prefix-LM): j <= i or j < P.
sliding: 0 <= i - j < W (causal) or |i - j| < W (bidirectional).
local_global (Longformer/BigBird-style): the sliding window, plus global tokens (the first G, and
every k-th) that see and are seen by all (in a causal model only earlier positions).
bigbird (Zaheer et al. 2020): local_global plus, for each query block of ``block_size`` tokens,
``random_blocks`` key blocks drawn at random (in a causal model among the blocks before it). The
draw of query block b comes from a generator seeded by (``random_seed``, b) alone, so the pattern
of a position never depends on the sequence length: a run, its resume, the KV cache and an
export see the same keys. Cost: O(T (W + G + r B)) allowed pairs instead of O(T^2).
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.config import AttentionConfig


def stack_mask(cfg: AttentionConfig, causal: bool) -> str:
    """The mask kind one stack uses: ``attention.mask`` names the pattern; its direction is the
    stack's own (an encoder-decoder's encoder is bidirectional and its decoder causal)."""
    if cfg.mask in ("causal", "bidirectional"):
        return "causal" if causal else "bidirectional"
    if cfg.mask == "prefix" and not causal:
        return "bidirectional"
    return cfg.mask


def allowed_keys(cfg: AttentionConfig, q_pos: Tensor, k_pos: Tensor, causal: bool) -> Tensor:
    """Boolean [Tq, Tk]: True where query i may attend to key j."""
    i, j = q_pos[:, None], k_pos[None, :]
    past = j <= i
    mask = stack_mask(cfg, causal)
    if mask == "bidirectional":
        return torch.ones(i.shape[0], j.shape[1], dtype=torch.bool, device=q_pos.device)
    if mask == "causal":
        return past
    if mask == "prefix":
        return past | (j < cfg.prefix_len)
    near = ((i - j) < cfg.window) & past if causal else (i - j).abs() < cfg.window
    if mask == "sliding":
        return near

    # local_global and bigbird
    def is_global(p: Tensor) -> Tensor:
        g = p < cfg.n_global
        if cfg.global_every:
            g = g | (p % cfg.global_every == 0)
        return g

    seen = near | is_global(j) | is_global(i)
    if mask == "bigbird":
        seen = seen | random_blocks(cfg, q_pos, k_pos, causal)
    return seen & past if causal else seen


def random_blocks(cfg: AttentionConfig, q_pos: Tensor, k_pos: Tensor, causal: bool) -> Tensor:
    """Boolean [Tq, Tk]: the random key blocks of each query's block (BigBird)."""
    B = cfg.block_size
    qb, kb = q_pos // B, k_pos // B
    n_blocks = int(k_pos.max()) // B + 1 if k_pos.numel() else 0
    out = torch.zeros(q_pos.numel(), k_pos.numel(), dtype=torch.bool, device=q_pos.device)
    for b in torch.unique(qb).tolist():
        # causal: among the blocks before b (the pattern of b then never depends on T)
        pool = b if causal else n_blocks
        if pool < 1:
            continue
        g = torch.Generator().manual_seed(cfg.random_seed * 1_000_003 + b)
        chosen = torch.randperm(pool, generator=g)[: cfg.random_blocks].to(q_pos.device)
        out[qb == b] |= torch.isin(kb, chosen)[None, :]
    return out
