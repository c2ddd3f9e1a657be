"""How well a database retrieves planted facts (:mod:`attnlab.data.synth_facts`).

For each validation statement ``key=value;`` (token rows ``[fact, key_start, value_start,
value_end]``) a neighbour *holds the fact* when its tokens (chunk plus continuation) contain the
statement's tokens ``key=value`` (from ``key_start`` to ``value_end``). Two recalls over the
statements:

* ``reading``: among the neighbours of chunk ``value_start // m - 1``, the ones token
  ``value_start - 1`` reads under chunked cross-attention (the token that predicts the first
  answer token). This is what a retrieval model can use; it needs the key in that chunk (or the
  retriever's luck), so it is below ``key`` by construction of RETRO's chunking.
* ``key``: among the neighbours of the chunk holding the ``=`` after the key (the chunk whose
  query text holds the key): the retriever's own quality.

Cost: one substring test per neighbour of the two chunks per statement.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnlab.data.retrieval import Database, neighbour_tokens
from attnlab.data.tokendata import TokenData


def _holds(neighbours: np.ndarray, needle: np.ndarray) -> bool:
    width = np.dtype(np.int64).itemsize
    pattern = needle.astype(np.int64).tobytes()
    for row in neighbours:
        raw = row.astype(np.int64).tobytes()
        at = raw.find(pattern)
        while at >= 0:
            if at % width == 0:
                return True
            at = raw.find(pattern, at + 1)
    return False


def fact_recall(db: Database, data: TokenData, statements: np.ndarray) -> dict[str, Any]:
    """``{"statements", "reading", "key"}``: recall of the validation statements (module doc)."""
    m, r = db.chunk_size, db.neighbour_len
    idx = np.asarray(db.val)
    val = np.asarray(data.val)
    hits = {"reading": 0, "key": 0}
    counted = 0
    for _, ks, vs, ve in np.asarray(statements, dtype=np.int64):
        chunks = {"reading": vs // m - 1, "key": (vs - 1) // m}
        if chunks["reading"] < 0 or chunks["key"] >= len(idx):
            continue
        counted += 1
        needle = val[ks:ve]
        for name, c in chunks.items():
            nbr = neighbour_tokens(data.train, idx[c], m, r, data.eos_id)
            hits[name] += _holds(nbr, needle)
    return {
        "statements": counted,
        **{name: (h / counted if counted else float("nan")) for name, h in hits.items()},
    }
