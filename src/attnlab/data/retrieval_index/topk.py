"""The k best columns of one score row, as every exact (dense-row) BM25 search ranks them: the
highest scores, ties to the lower chunk index, -inf (excluded) never chosen. Cost O(n) per row
(a partition, then a sort of the k candidates)."""

from __future__ import annotations

import numpy as np


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """The k best columns of one row, ties to the lower index; -1 where fewer are allowed."""
    out = np.full(k, -1, dtype=np.int64)
    valid = np.isfinite(scores)
    n = int(valid.sum())
    if n == 0:
        return out
    kk = min(k, n)
    kth = np.partition(np.where(valid, scores, -np.inf), -kk)[-kk]
    cand = np.nonzero(valid & (scores >= kth))[0]
    order = cand[np.lexsort((cand, -scores[cand]))][:kk]
    out[:kk] = order
    return out
