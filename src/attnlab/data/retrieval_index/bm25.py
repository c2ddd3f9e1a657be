"""BM25 over word-like terms through bm25s' own index and top-k retrieval.

``bm25s.BM25(method="lucene", k1=1.5, b=0.75)`` indexes the database chunks' term ids
(:mod:`.terms`) and ``BM25.retrieve`` returns each query's best chunks (its numba backend when
numba is installed, else numpy; a query's result does not depend on the other queries, so the
bytes do not depend on how queries are split across workers). bm25s scores a query into one
float32 row over the database and selects its top k there (O(chunks) per query: the constant is
small, the growth quadratic).

The leakage rule (:mod:`.leakage`) runs by over-fetching k + ``OVERFETCH`` chunks and dropping the
excluded ones; a query left with fewer than k allowed chunks, while more matching chunks may
exist, is fetched again with bm25s' ``weight_mask`` zeroing its excluded chunks (the index's own
filter: exact). Chunks sharing no term with the query (score 0) are never neighbours: such a
slot is -1 (padding), as when the rule leaves too few.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from attnlab.data.retrieval_index.leakage import pick

OVERFETCH = 32
METHOD = {"method": "lucene", "k1": 1.5, "b": 0.75}


NUMBA_FROM = 20_000  # databases at least this large use numba (its JIT costs ~10 s a process)


def backend(n_chunks: int) -> str:
    """bm25s' scorer: numba when installed and the database is large (2-5x faster per query),
    else numpy. The backend is part of the build's settings: their top-k break ties apart."""
    from importlib.util import find_spec

    return "numba" if n_chunks >= NUMBA_FROM and find_spec("numba") is not None else "numpy"


def build(corpus_ids: list[list[int]], vocab: dict[str, int]) -> Any:
    """A bm25s index of the chunks' term ids (``vocab``: term -> id, ids 0..V-1)."""
    import bm25s

    bm = bm25s.BM25(**METHOD, backend=backend(len(corpus_ids)))
    bm.index((corpus_ids, vocab), create_empty_token=False, show_progress=False)
    return bm


def save(bm: Any, directory: Path) -> None:
    bm.save(str(directory), show_progress=False)


def load(directory: Path) -> Any:
    """The index saved in ``directory``, its score arrays memory-mapped."""
    import bm25s

    bm = bm25s.BM25.load(str(directory), mmap=True, show_progress=False)
    bm.backend = backend(int(bm.scores["num_docs"]))
    return bm


def _retrieve(bm: Any, queries: list[list[int]], k: int, mask: np.ndarray | None = None):
    res = bm.retrieve(queries, k=k, sorted=True, show_progress=False, n_threads=1, weight_mask=mask)
    return np.asarray(res.documents, dtype=np.int64), np.asarray(res.scores, dtype=np.float64)


def search(
    bm: Any, queries: list[list[int]], k: int, first: np.ndarray, last: np.ndarray
) -> np.ndarray:
    """Neighbours [len(queries), k] (-1 padded), excluding chunks [first_i, last_i) of query i."""
    n_db = int(bm.scores["num_docs"])
    out = np.full((len(queries), k), -1, dtype=np.int64)
    live = [i for i, q in enumerate(queries) if q]  # a query without known terms matches nothing
    if not live:
        return out
    kk = min(n_db, k + OVERFETCH)
    docs, scores = _retrieve(bm, [queries[i] for i in live], kk)
    scores = np.where(scores > 0, scores, -np.inf)
    for row, i in enumerate(live):
        out[i], allowed = pick(docs[row], scores[row], first[i], last[i], k)
        exhausted = kk >= n_db or not np.isfinite(scores[row]).all()
        if allowed < k and not exhausted and last[i] > first[i]:
            mask = np.ones(n_db, dtype=np.float32)
            mask[first[i] : last[i]] = 0.0
            d, s = _retrieve(bm, [queries[i]], min(n_db, k), mask)
            out[i], _ = pick(d[0], np.where(s[0] > 0, s[0], -np.inf), first[i], last[i], k)
    return out
