"""Masks as dense boolean [Tq, Tk] matrices over absolute positions: the attention engine's
fallback (the explicit path and the score parts that form the T x T matrix) and the independent
reference the engine's masks are tested against. Which mask a model uses is its mask part's
(``model/parts/mask_*.py``); nothing here is chosen by name.

- :func:`dense_allowed`: any engine :class:`~attnlab.model.engine.Mask`, its ``mask_mod`` on the
  grid (O(Tq Tk) memory, what the explicit path forms anyway);
- :func:`reference_pairs`: the built-in patterns written out from their definitions:
  causal j <= i; bidirectional all; prefix (prefix-LM) j <= i or j < P; sliding 0 <= i - j < W
  (causal) or |i - j| < W; local+global (Longformer/BigBird-style) the window plus global tokens
  (the first G, and every k-th) that see and are seen by all (in a causal model only earlier
  positions); BigBird (Zaheer et al. 2020) local+global plus, for each query block of
  ``block_size`` tokens, ``random_blocks`` key blocks drawn at random (in a causal model among
  the blocks before it). The draw of query block b comes from a generator seeded by
  (``random_seed``, b) alone, so the pattern of a position never depends on the sequence
  length: a run, its resume, the KV cache and an export see the same keys.
"""

from __future__ import annotations

import torch
from torch import Tensor


def dense_allowed(mask, q_pos: Tensor, k_pos: Tensor, batch: int = 1) -> Tensor:
    """[Tq, Tk] bool (``[B, 1, Tq, Tk]`` for a mask that reads the batch row, e.g. document
    ids): True where query ``q_pos[i]`` may attend to key ``k_pos[j]``."""
    end = int(q_pos.max()) + 1 if q_pos.numel() else 0
    fitted = mask.fit(end, int(k_pos.max()) + 1 if k_pos.numel() else 0, q_pos.device)
    rows = batch if fitted.uses_batch else 1
    b = torch.arange(rows, device=q_pos.device)[:, None, None]
    h = torch.zeros((), dtype=torch.long, device=q_pos.device)
    out = fitted.mask_mod(b, h, q_pos[None, :, None], k_pos[None, None, :])
    out = out.expand(rows, len(q_pos), len(k_pos))
    return out[:, None] if fitted.uses_batch else out[0]


def reference_pairs(
    q_pos: Tensor,
    k_pos: Tensor,
    causal: bool,
    *,
    window: int | None = None,
    prefix_len: int = 0,
    n_global: int = 0,
    global_every: int = 0,
    block_size: int = 16,
    random_blocks: int = 0,
    random_seed: int = 0,
) -> Tensor:
    """Boolean [Tq, Tk] of the built-in patterns by their options (no ``window``: causal,
    bidirectional or prefix; with it: sliding, local+global, BigBird)."""
    i, j = q_pos[:, None], k_pos[None, :]
    past = j <= i
    if window is None:
        if not causal:
            return torch.ones(i.shape[0], j.shape[1], dtype=torch.bool, device=q_pos.device)
        return past | (j < prefix_len)
    seen = ((i - j) < window) & past if causal else (i - j).abs() < window

    def is_global(p: Tensor) -> Tensor:
        g = p < n_global
        if global_every:
            g = g | (p % global_every == 0)
        return g

    seen = seen | is_global(j) | is_global(i)
    if random_blocks:
        seen = seen | random_block_pairs(
            q_pos, k_pos, causal, block_size, random_blocks, random_seed
        )
    return seen & past if causal else seen


def random_block_pairs(
    q_pos: Tensor, k_pos: Tensor, causal: bool, block_size: int, random_blocks: int, seed: int
) -> Tensor:
    """Boolean [Tq, Tk]: the random key blocks of each query's block (BigBird)."""
    B = block_size
    qb, kb = q_pos // B, k_pos // B
    n_blocks = int(k_pos.max()) // B + 1 if k_pos.numel() else 0
    out = torch.zeros(q_pos.numel(), k_pos.numel(), dtype=torch.bool, device=q_pos.device)
    for b in torch.unique(qb).tolist():
        # causal: among the blocks before b (the pattern of b then never depends on T)
        pool = b if causal else n_blocks
        if pool < 1:
            continue
        g = torch.Generator().manual_seed(seed * 1_000_003 + b)
        chosen = torch.randperm(pool, generator=g)[:random_blocks].to(q_pos.device)
        out[qb == b] |= torch.isin(kb, chosen)[None, :]
    return out
