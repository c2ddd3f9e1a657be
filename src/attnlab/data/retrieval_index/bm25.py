"""BM25 over word-like terms: bm25s' index, searched with a bounded cost per query.

``bm25s.BM25(method="lucene", k1=1.5, b=0.75)`` indexes the database chunks' term ids
(:mod:`.terms`) into its term -> chunks score matrix, saved with the database and memory-mapped
when loaded. bm25s' own ``BM25.retrieve`` scores each query into a dense float32 row over the
whole database and scans it for the top k (its numpy and numba backends alike; ``weight_mask``
multiplies that row, ``n_threads`` splits the queries): O(n) per query, so a build that queries
every chunk grows as n^2. The search here (:mod:`.impact`) reads the same score matrix with a
bounded number of query terms and postings per term, so a query's cost does not grow with n; it
ranks every chunk its postings reach, so the leakage rule (:mod:`.leakage`) is applied to the
full candidate list (exact for the bounded scores: no over-fetch). A query's result does not
depend on the other queries, so the bytes do not depend on how queries are split across workers.
Chunks sharing no kept term with the query are never neighbours: such a slot is -1 (padding),
as when the rule leaves too few.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from attnlab.data.retrieval_index import impact
from attnlab.data.retrieval_index.spec import IndexSpec

METHOD = {"method": "lucene", "k1": 1.5, "b": 0.75}


def build(corpus_ids: list[list[int]], vocab: dict[str, int]) -> Any:
    """A bm25s index of the chunks' term ids (``vocab``: term -> id, ids 0..V-1)."""
    import bm25s

    bm = bm25s.BM25(**METHOD)
    bm.index((corpus_ids, vocab), create_empty_token=False, show_progress=False)
    return bm


def save(bm: Any, directory: Path) -> None:
    bm.save(str(directory), show_progress=False)


def load(directory: Path) -> Any:
    """The index saved in ``directory``, its score arrays memory-mapped."""
    import bm25s

    return bm25s.BM25.load(str(directory), mmap=True, show_progress=False)


def pruned(bm: Any, spec: IndexSpec) -> impact.Pruned:
    """The index's postings pruned to ``spec.postings`` per term (done once per load)."""
    return impact.prune(bm.scores, spec.postings)


def search(
    index: impact.Pruned,
    queries: list[list[int]],
    k: int,
    first: np.ndarray,
    last: np.ndarray,
    spec: IndexSpec,
) -> np.ndarray:
    """Neighbours [len(queries), k] (-1 padded), excluding chunks [first_i, last_i) of query i."""
    return impact.search(index, queries, k, first, last, spec.query_terms)
