"""Train/validation split by document, decided by a seeded hash of each document's text.

``u(doc) = sha256(f"{seed}:" + text)[:8] / 2**64`` is uniform in [0, 1); a document goes to
validation iff ``u < val_fraction``. Because the rule depends only on the text, it is
deterministic, independent of document order and of ``--max-documents``, and exact duplicates
always land on the same side (no train/validation leakage through duplicated documents).

With few documents the hash can leave a side empty; then the document with the smallest ``u``
moves to validation (or the largest to train), so any corpus of >= 2 documents has both splits.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from attnlab.base.errors import UserError


def document_u(text: str | bytes, seed: int = 0) -> float:
    """The document's hash position in [0, 1)."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    digest = hashlib.sha256(f"{seed}:".encode() + data).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def assign_splits(u: Sequence[float] | np.ndarray, val_fraction: float) -> np.ndarray:
    """Boolean mask ``is_val`` for documents with hash positions ``u`` (see module docstring)."""
    if not 0.0 <= val_fraction < 1.0:
        raise UserError(f"val_fraction={val_fraction} must be in [0, 1)")
    u = np.asarray(u, dtype=np.float64)
    is_val = u < val_fraction
    if val_fraction > 0 and len(u) >= 2:
        if not is_val.any():
            is_val[np.argmin(u)] = True
        if is_val.all():
            is_val[np.argmax(u)] = False
    return is_val
