"""A dense index of chunk embeddings: faiss' HNSW graph, inner product on unit vectors.

``faiss.IndexHNSWFlat(d, M, METRIC_INNER_PRODUCT)`` (Malkov & Yashunin 2018): each vector is
linked to about M neighbours on each level of a navigable small-world graph; an insertion and a
search walk the graph with a beam of ``efConstruction`` / ``efSearch`` candidates, O(log n)
distance evaluations each, so a build and a search of every chunk cost O(n log n). RETRO used
ScaNN, the same family of approximate indices. The graph is built on one thread (faiss' HNSW
insertion on several threads depends on their timing; one thread and its fixed level seed give
the same graph, so the same bytes, on every run). Searches are independent per query, so they
run on ``workers`` threads with the same result.

Leakage (:mod:`.leakage`): search k + ``OVERFETCH``, drop the excluded chunks; a query left with
fewer than k is searched again through faiss' own filter (``IDSelectorNot(IDSelectorRange)``
over its excluded run, ``SearchParametersHNSW(sel=...)``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from attnlab.data.retrieval_index.leakage import pick
from attnlab.data.retrieval_index.spec import IndexSpec

OVERFETCH = 32


def build(blocks: list[np.ndarray], dim: int, spec: IndexSpec) -> Any:
    """The HNSW graph of the unit rows of ``blocks`` (each [b, dim], e.g. memory-mapped files),
    added block by block on one thread (no copy of the whole set)."""
    import faiss

    faiss.omp_set_num_threads(1)
    index = faiss.IndexHNSWFlat(dim, spec.hnsw_m, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = spec.ef_construction
    for vectors in blocks:
        index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    return index


def save(index: Any, path: Path) -> None:
    import faiss

    faiss.write_index(index, str(path))


def load(path: Path) -> Any:
    import faiss

    return faiss.read_index(str(path))


def search(
    index: Any,
    queries: np.ndarray,
    k: int,
    first: np.ndarray,
    last: np.ndarray,
    spec: IndexSpec,
    threads: int = 1,
) -> np.ndarray:
    """Neighbours [len(queries), k] (-1 padded), excluding chunks [first_i, last_i) of query i."""
    import faiss

    faiss.omp_set_num_threads(max(1, threads))
    n_db = index.ntotal
    kk = min(n_db, k + OVERFETCH)
    params = faiss.SearchParametersHNSW(efSearch=max(spec.ef_search, kk))
    sims, ids = index.search(np.ascontiguousarray(queries, dtype=np.float32), kk, params=params)
    out = np.full((len(queries), k), -1, dtype=np.int64)
    for i in range(len(queries)):
        out[i], allowed = pick(ids[i], sims[i], first[i], last[i], k)
        if allowed < k and kk < n_db and last[i] > first[i]:
            sel = faiss.IDSelectorNot(faiss.IDSelectorRange(int(first[i]), int(last[i])))
            p = faiss.SearchParametersHNSW(sel=sel, efSearch=max(spec.ef_search, kk))
            s, d = index.search(np.ascontiguousarray(queries[i : i + 1]), min(n_db, kk), params=p)
            out[i], _ = pick(d[0], s[0], first[i], last[i], k)
    return out
