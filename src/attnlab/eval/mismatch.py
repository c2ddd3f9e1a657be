"""Mismatched neighbours, the content control of a retrieval evaluation: window ``i`` is fed the
neighbours of window ``source[i] != i``, drawn reproducibly from a seed.

A model whose cross-attention has become an input that ignores what its neighbours say (a bias,
a separator cue) scores the same with another window's neighbours as with its own; only a model
that reads them loses. So a retrieval gain is real-vs-mismatched, not with-vs-without.

    order = permutation_seed(n);  source[order[j]] = order[(j + 1) mod n]

a cyclic shift along a random order: a derangement (no window keeps its own neighbours) for any
n >= 2, the same for a seed on every machine (numpy's PCG64). Cost O(n).
"""

from __future__ import annotations

import numpy as np

from attnlab.base.errors import UserError


def mismatched_windows(n: int, seed: int = 0) -> np.ndarray:
    """``source`` [n] int64: window ``i`` reads window ``source[i]``'s neighbours, never its own."""
    if n < 2:
        raise UserError(
            f"mismatched neighbours need at least 2 validation windows, got {n}; "
            "raise --limit or use a longer validation split"
        )
    order = np.random.default_rng(seed).permutation(n)
    source = np.empty(n, dtype=np.int64)
    source[order] = np.roll(order, -1)
    return source
