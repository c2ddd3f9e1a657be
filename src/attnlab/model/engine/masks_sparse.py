"""The sparse masks with global tokens: local+global (Longformer) and BigBird (Zaheer et al.).

Semantics exactly as ``model/masks.py`` (i = q_idx, j = kv_idx):

- ``LocalGlobal(w, n_global, global_every)``: the sliding window, plus global tokens (the first
  ``n_global``, and every ``global_every``-th) that see and are seen by all; in a causal model
  only earlier positions. O(T (w + G)) pairs, G the number of global tokens.
- ``BigBird``: local+global plus, for each query block of ``block_size`` tokens,
  ``random_blocks`` key blocks drawn at random (causal: among the blocks before it). Block b's
  draw comes from a generator seeded by (``seed``, b) alone, as in ``model/masks.py``: the pattern
  of a causal position never depends on the sequence length. O(T (w + G + r B)) pairs.

Structure for the engine: the window as ``window``/``causal``, the global tokens as
``global_keys`` (gathered one by one, not by block) and ``global_queries`` (rows computed over
all keys), BigBird's random blocks as a [query block, key block] table in ``block_map``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.model.engine.contracts import Mask


class LocalGlobal(Mask):
    """Window of w keys, plus the first ``n_global`` and every ``global_every``-th token global."""

    name = "local_global"

    def __init__(
        self, window: int, n_global: int = 0, global_every: int = 0, causal: bool = True
    ) -> None:
        self.window, self.causal = int(window), bool(causal)
        self.n_global, self.global_every = int(n_global), int(global_every)

    def is_global(self, p: Tensor) -> Tensor:
        g = p < self.n_global
        if self.global_every:
            g = g | (p % self.global_every == 0)
        return g

    def near(self, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        d = q_idx - kv_idx
        return (
            (d < self.window) & (d >= 0) if self.causal else (d < self.window) & (-d < self.window)
        )

    def mask_mod(self, b, h, q_idx, kv_idx):
        seen = self.near(q_idx, kv_idx) | self.is_global(kv_idx) | self.is_global(q_idx)
        return seen & (kv_idx <= q_idx) if self.causal else seen

    def global_keys(self, kv_len: int, device) -> Tensor:
        p = torch.arange(kv_len, device=device)
        return p[self.is_global(p)]

    def global_queries(self, q_offset: int, q_len: int, device) -> Tensor:
        p = torch.arange(q_offset, q_offset + q_len, device=device)
        return p[self.is_global(p)]


class BigBird(LocalGlobal):
    """Local+global plus ``random_blocks`` seeded random key blocks per query block."""

    name = "bigbird"

    def __init__(
        self,
        window: int,
        n_global: int = 0,
        global_every: int = 0,
        block_size: int = 16,
        random_blocks: int = 1,
        seed: int = 0,
        causal: bool = True,
    ) -> None:
        super().__init__(window, n_global, global_every, causal)
        self.block_size, self.random_blocks, self.seed = int(block_size), int(random_blocks), seed
        self.table: Tensor | None = None  # [query blocks, key blocks] bool, built by fit()
        self._fitted: dict[tuple, BigBird] = {}

    def fit(self, q_end: int, kv_len: int, device) -> BigBird:
        """A copy with the random-block table for queries below ``q_end`` and ``kv_len`` keys
        (one more row and column of blocks than needed, so a kernel that reads a padded block's
        positions stays inside it)."""
        key = (q_end, kv_len, str(device))
        if key not in self._fitted:
            out = BigBird.__new__(BigBird)
            out.__dict__.update({k: v for k, v in self.__dict__.items() if k != "_fitted"})
            out._fitted = {}
            out.table = self.random_table(q_end, kv_len, device)
            self._fitted = {key: out}  # one shape at a time: a decode step refits
        return self._fitted[key]

    def random_table(self, q_end: int, kv_len: int, device) -> Tensor:
        """[nQ + 1, nK + 1] bool: query block b's random key blocks (``model/masks.py``'s draw)."""
        B = self.block_size
        n_kv = -(-kv_len // B)
        n_q = -(-q_end // B)
        table = torch.zeros(n_q + 1, max(n_kv, n_q) + 1, dtype=torch.bool)
        for b in range(n_q):
            pool = b if self.causal else n_kv
            if pool < 1:
                continue
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + b)
            table[b, torch.randperm(pool, generator=g)[: self.random_blocks]] = True
        return table.to(device)

    def token(self) -> object:
        return (super().token(), None if self.table is None else tuple(self.table.shape))

    def mask_mod(self, b, h, q_idx, kv_idx):
        if self.table is None:
            raise RuntimeError("BigBird.mask_mod before fit(): the engine fits every mask first")
        B = self.block_size
        seen = (
            self.near(q_idx, kv_idx)
            | self.is_global(kv_idx)
            | self.is_global(q_idx)
            | self.table[q_idx // B, kv_idx // B]
        )
        return seen & (kv_idx <= q_idx) if self.causal else seen

    def block_map(self, q_lo, q_hi, kv_lo, kv_hi):
        """The window's blocks, or any random block inside the pair of blocks (2-D prefix sums
        of the table: O(1) per pair)."""
        near = super().block_map(q_lo, q_hi, kv_lo, kv_hi)
        B = self.block_size
        t = self.table.int()
        S = torch.zeros(t.shape[0] + 1, t.shape[1] + 1, dtype=torch.int64, device=t.device)
        S[1:, 1:] = t.cumsum(0).cumsum(1)
        r0, r1 = (q_lo // B)[:, None], (q_hi // B + 1)[:, None]
        c0, c1 = (kv_lo // B)[None, :], (kv_hi // B + 1)[None, :]
        count = S[r1, c1] - S[r0, c1] - S[r1, c0] + S[r0, c0]
        out = near | (count > 0)
        return out & (kv_lo[None, :] <= q_hi[:, None]) if self.causal else out
