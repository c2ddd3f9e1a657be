"""The contiguous masks: full, causal, prefix, sliding window, document, and key padding.

With i = q_idx, j = kv_idx (absolute positions; ``model/masks.py`` has the same semantics):

- ``Full``: every pair (an encoder);
- ``Causal``: j <= i;
- ``Prefix(P)`` (prefix LM): j <= i or j < P;
- ``Sliding(w)``: 0 <= i - j < w (causal) or |i - j| < w (bidirectional); O(T w) pairs;
- ``Document(doc_ids)``: doc[b, i] == doc[b, j] (and j <= i when causal), no attention across
  the documents of a packed sequence; O(sum of squared document lengths) pairs;
- ``Padded(mask, kv_valid)``: ``mask`` and key j is a real token of row b (a right-padded
  batch).

Each declares its structure (``causal``, ``window``, ``dense``, ``block_map``), so the engine
skips blocks with no allowed pair without evaluating T^2 entries.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.model.engine.contracts import Mask, version


class Full(Mask):
    """Every query sees every key."""

    name = "full"

    def mask_mod(self, b, h, q_idx, kv_idx):
        return (q_idx >= 0) & (kv_idx >= 0)

    def dense(self, q_len: int, kv_len: int, q_offset: int) -> str | None:
        return "full"

    def block_map(self, q_lo, q_hi, kv_lo, kv_hi):
        return torch.ones(len(q_lo), len(kv_lo), dtype=torch.bool, device=q_lo.device)


class Causal(Mask):
    """j <= i."""

    name = "causal"
    causal = True

    def mask_mod(self, b, h, q_idx, kv_idx):
        return kv_idx <= q_idx

    def dense(self, q_len: int, kv_len: int, q_offset: int) -> str | None:
        if q_offset >= kv_len - 1:  # every key is at or before the first query (decoding)
            return "full"
        if q_offset == 0 and q_len == kv_len:
            return "causal"
        return None


class Prefix(Mask):
    """j <= i or j < P: the first P tokens (the prompt) are seen by every query."""

    name = "prefix"

    def __init__(self, prefix_len: int) -> None:
        self.prefix_len = int(prefix_len)

    def mask_mod(self, b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) | (kv_idx < self.prefix_len)

    def dense(self, q_len: int, kv_len: int, q_offset: int) -> str | None:
        if q_offset >= kv_len - 1 or kv_len <= self.prefix_len:
            return "full"
        return None

    def block_map(self, q_lo, q_hi, kv_lo, kv_hi):
        return (kv_lo[None, :] <= q_hi[:, None]) | (kv_lo[None, :] < self.prefix_len)


class Sliding(Mask):
    """0 <= i - j < w (causal) or |i - j| < w: a window of w keys."""

    name = "sliding"

    def __init__(self, window: int, causal: bool = True) -> None:
        self.window, self.causal = int(window), bool(causal)

    def mask_mod(self, b, h, q_idx, kv_idx):
        d = q_idx - kv_idx
        if self.causal:
            return (d >= 0) & (d < self.window)
        return (d < self.window) & (d > -self.window)

    def dense(self, q_len: int, kv_len: int, q_offset: int) -> str | None:
        if self.causal and q_offset + q_len <= self.window:  # the window holds the whole past
            return Causal().dense(q_len, kv_len, q_offset)
        return None


class Document(Mask):
    """doc[b, i] == doc[b, j] (and j <= i when causal): packed documents stay apart.

    ``doc_ids`` [B, L] (or [L], the same for every row): the document of each position, L >=
    the longest position a call reads. Ids need not be sorted; ``block_map`` uses each block's
    [min, max] id per row, which covers every equal pair."""

    name = "document"
    uses_batch = True

    def __init__(self, doc_ids: Tensor, causal: bool = True) -> None:
        self.uses_batch = doc_ids.dim() == 2
        ids = doc_ids if self.uses_batch else doc_ids[None]
        self.doc_ids, self.causal = ids.long(), bool(causal)

    def token(self) -> object:
        return ("document", self.causal, id(self.doc_ids), version(self.doc_ids))

    def mask_mod(self, b, h, q_idx, kv_idx):
        ids = self.doc_ids if self.uses_batch else self.doc_ids[0]
        if self.uses_batch:
            same = ids[b, q_idx] == ids[b, kv_idx]
        else:
            same = ids[q_idx] == ids[kv_idx]
        return same & (kv_idx <= q_idx) if self.causal else same

    def block_map(self, q_lo, q_hi, kv_lo, kv_hi):
        ids = self.doc_ids
        qmin, qmax = _block_range(ids, q_lo, q_hi)  # [B, nQ]
        kmin, kmax = _block_range(ids, kv_lo, kv_hi)  # [B, nK]
        meet = (qmin[:, :, None] <= kmax[:, None, :]) & (kmin[:, None, :] <= qmax[:, :, None])
        out = meet.any(0)
        return out & (kv_lo[None, :] <= q_hi[:, None]) if self.causal else out


class Padded(Mask):
    """``mask`` and key j is a real token of row b: ``kv_valid`` [B, Tk] bool (right padding)."""

    uses_batch = True

    def __init__(self, mask: Mask, kv_valid: Tensor) -> None:
        self.inner, self.kv_valid = mask, kv_valid.bool()
        self.causal, self.window, self.block_size = mask.causal, mask.window, mask.block_size
        self.name = f"{mask.name}+padding"

    def token(self) -> object:
        return ("padded", self.inner.token(), id(self.kv_valid), version(self.kv_valid))

    def fit(self, q_end: int, kv_len: int, device) -> Mask:
        inner = self.inner.fit(q_end, kv_len, device)
        return self if inner is self.inner else Padded(inner, self.kv_valid)

    def mask_mod(self, b, h, q_idx, kv_idx):
        return self.inner.mask_mod(b, h, q_idx, kv_idx) & self.kv_valid[b, kv_idx]

    def block_map(self, q_lo, q_hi, kv_lo, kv_hi):
        return self.inner.block_map(q_lo, q_hi, kv_lo, kv_hi)

    def global_keys(self, kv_len: int, device):
        return self.inner.global_keys(kv_len, device)

    def global_queries(self, q_offset: int, q_len: int, device):
        return self.inner.global_queries(q_offset, q_len, device)


def _block_range(ids: Tensor, lo: Tensor, hi: Tensor) -> tuple[Tensor, Tensor]:
    """Per row and block [lo, hi] (inclusive positions, hi clipped to the ids' length): the
    smallest and largest id, [B, n] each; O(B L) work."""
    hi = hi.clamp_max(ids.shape[1] - 1)
    mins = torch.stack([ids[:, a : z + 1].amin(1) for a, z in zip(lo.tolist(), hi.tolist())], 1)
    maxs = torch.stack([ids[:, a : z + 1].amax(1) for a, z in zip(lo.tolist(), hi.tolist())], 1)
    return mins, maxs
