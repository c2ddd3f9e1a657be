"""A dense index of chunk embeddings: faiss' HNSW graphs, inner product on unit vectors, sharded.

``faiss.IndexHNSWFlat(d, M, METRIC_INNER_PRODUCT)`` (Malkov & Yashunin 2018): each vector is
linked to about M neighbours on each level of a navigable small-world graph; an insertion and a
search walk the graph with a beam of ``efConstruction`` / ``efSearch`` candidates, O(log n)
distance evaluations each, so a build and a search of every chunk cost O(n log n). RETRO used
ScaNN, the same family of approximate indices.

**Shards.** faiss builds one HNSW graph on several OpenMP threads by inserting points
concurrently under locks: the graph, so the neighbours and the bytes, then depend on the
threads' timing. One thread gives the same graph on every run (a fixed level seed), but uses one
core. So the database is split into ``spec.shards`` contiguous ranges of chunks (a fixed number,
not the worker count), each range's graph built on one thread, the graphs on ``workers`` Python
threads at once (faiss releases the GIL). A query searches every graph (efSearch each) and the
candidates are merged by (similarity desc, chunk asc): the answer does not depend on the
workers. Cost: S graphs of n/S points build in O(n log(n/S)) in all, S-fold parallel; a query
costs S searches of O(log(n/S)).

Leakage (:mod:`.leakage`): search k + ``OVERFETCH`` per graph, drop the excluded chunks; a query
left with fewer than k is searched again through faiss' own filter (``IDSelectorNot
(IDSelectorRange)`` over its excluded run, ``SearchParametersHNSW(sel=...)``) in every graph.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.data.retrieval_index.leakage import pick
from attnlab.data.retrieval_index.spec import IndexSpec

OVERFETCH = 32


def shard_bounds(n: int, shards: int) -> np.ndarray:
    """The first chunk of every shard, and n: ``[0, n/S, 2n/S, ..., n]`` (floored)."""
    return np.array([n * s // shards for s in range(shards + 1)], dtype=np.int64)


def shard_file(s: int) -> str:
    return f"index-{s:02d}.faiss"


def _rows(blocks: Sequence[np.ndarray], lo: int, hi: int, step: int = 65536):
    """Rows [lo, hi) of the concatenation of ``blocks``, ``step`` at a time (no full copy)."""
    starts = np.concatenate([[0], np.cumsum([len(b) for b in blocks])])
    for a in range(lo, hi, step):
        b_hi = min(a + step, hi)
        parts = []
        for j, blk in enumerate(blocks):
            s, e = max(a, starts[j]), min(b_hi, starts[j + 1])
            if s < e:
                parts.append(np.asarray(blk[s - starts[j] : e - starts[j]]))
        yield np.ascontiguousarray(np.concatenate(parts), dtype=np.float32)


def build_shard(blocks: Sequence[np.ndarray], lo: int, hi: int, dim: int, spec: IndexSpec) -> Any:
    """The HNSW graph of rows [lo, hi), inserted in order on this thread only."""
    import faiss

    faiss.omp_set_num_threads(1)  # this thread's OpenMP setting: one-thread insertion
    index = faiss.IndexHNSWFlat(dim, spec.hnsw_m, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = spec.ef_construction
    for vectors in _rows(blocks, lo, hi):
        index.add(vectors)
    return index


def build_missing(
    blocks: Sequence[np.ndarray], dim: int, spec: IndexSpec, where: Path, workers: int
) -> None:
    """Every shard graph not yet in ``where`` built (``workers`` at once) and saved atomically."""
    n = sum(len(b) for b in blocks)
    bounds = shard_bounds(n, spec.shards)

    def one(s: int) -> None:
        index = build_shard(blocks, int(bounds[s]), int(bounds[s + 1]), dim, spec)
        tmp = where / f".{shard_file(s)}.tmp"
        save(index, tmp)
        tmp.replace(where / shard_file(s))

    todo = [s for s in range(spec.shards) if not (where / shard_file(s)).exists()]
    with ThreadPoolExecutor(max(1, min(workers, len(todo) or 1))) as pool:
        list(pool.map(one, todo))


def save(index: Any, path: Path) -> None:
    import faiss

    faiss.write_index(index, str(path))


def load(directory: Path, spec: IndexSpec) -> list[Any]:
    """The shard graphs stored in ``directory``."""
    import faiss

    return [faiss.read_index(str(directory / shard_file(s))) for s in range(spec.shards)]


def _search_all(graphs: list[Any], q: np.ndarray, kk: int, spec: IndexSpec, sel: Any = None):
    """Similarities and global chunk ids [Q, sum of per-graph kk] over every graph."""
    import faiss

    sims, ids, base = [], [], 0
    for g in graphs:
        n_g = g.ntotal
        if n_g:
            k_g = min(n_g, kk)
            kw = {} if sel is None else {"sel": sel(base, base + n_g)}  # referenced till searched
            p = faiss.SearchParametersHNSW(efSearch=max(spec.ef_search, k_g), **kw)
            s, d = g.search(q, k_g, params=p)
            sims.append(s)
            ids.append(np.where(d >= 0, d + base, -1))
        base += n_g
    return np.concatenate(sims, axis=1), np.concatenate(ids, axis=1)


def search(
    graphs: list[Any],
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
    n_db = sum(g.ntotal for g in graphs)
    kk = min(n_db, k + OVERFETCH)
    q = np.ascontiguousarray(queries, dtype=np.float32)
    sims, ids = _search_all(graphs, q, kk, spec)
    out = np.full((len(queries), k), -1, dtype=np.int64)
    for i in range(len(queries)):
        out[i], allowed = pick(ids[i], sims[i], first[i], last[i], k)
        if allowed < k and kk < n_db and last[i] > first[i]:
            lo, hi = int(first[i]), int(last[i])

            def sel(a: int, b: int, lo: int = lo, hi: int = hi) -> Any:  # local ids of the run
                return faiss.IDSelectorNot(faiss.IDSelectorRange(max(lo - a, 0), max(hi - a, 0)))

            s, d = _search_all(graphs, q[i : i + 1], kk, spec, sel)
            out[i], _ = pick(d[0], s[0], first[i], last[i], k)
    return out
