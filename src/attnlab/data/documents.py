"""Document boundaries of packed token streams: the tokenizer's end-of-text token closes each
document (``data prepare`` writes one after every document), so a training window of a packed
stream holds pieces of several documents, and the ``document`` mask part keeps attention inside
each (``model/parts/mask_document.py``).

``document_ids(x, eos_id)``: for each position, how many end-of-text tokens come before it in its
row; the end-of-text token itself belongs to the document it closes. O(B T), one cumulative sum.
"""

from __future__ import annotations

import numpy as np


def boundaries(x: np.ndarray, eos_id: int) -> list[np.ndarray]:
    """Per row of ``x`` [B, T]: the positions of its end-of-text tokens (where documents end)."""
    return [np.flatnonzero(row == eos_id) for row in np.asarray(x)]


def document_ids(x: np.ndarray, eos_id: int) -> np.ndarray:
    """[B, T] int64: the document of each position of the packed rows ``x`` [B, T] (0 for the
    piece the window starts in, +1 after each end-of-text token)."""
    ends = (np.asarray(x) == eos_id).astype(np.int64)
    return np.cumsum(ends, axis=1) - ends
