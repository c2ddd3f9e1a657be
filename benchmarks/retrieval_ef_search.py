"""How HNSW's recall against exact search grows with efSearch on a built database (issue 36).

    python benchmarks/retrieval_ef_search.py DATA/retrieval/m32-k2-c32-hnsw-random

Loads the database's shard graphs (``index-SS.faiss``), takes 500 of its own vectors plus a little
noise as queries, and compares the merged top 10 over every shard at efSearch 64-512 with the
exact top 10 (brute-force inner product). Search time per query: 1 thread.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import faiss
import numpy as np

K = 10
QUERIES = 500


def merged_top(graphs: list, q: np.ndarray, ef: int) -> np.ndarray:
    """The top ``K`` global ids over every shard, merged by similarity."""
    sims, ids, base = [], [], 0
    for g in graphs:
        s, i = g.search(q, K, params=faiss.SearchParametersHNSW(efSearch=ef))
        sims.append(s)
        ids.append(i + base)
        base += g.ntotal
    s, i = np.concatenate(sims, 1), np.concatenate(ids, 1)
    return np.take_along_axis(i, np.argsort(-s, 1)[:, :K], 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("database", type=Path, help="a database directory with index-SS.faiss")
    args = ap.parse_args()
    faiss.omp_set_num_threads(1)
    graphs = [faiss.read_index(str(f)) for f in sorted(args.database.glob("index-*.faiss"))]
    vecs = np.concatenate([g.storage.reconstruct_n(0, g.ntotal) for g in graphs])
    n, d = vecs.shape
    rng = np.random.default_rng(0)
    q = vecs[rng.choice(n, QUERIES, replace=False)]
    q = q + 0.05 * rng.standard_normal((QUERIES, d)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    exact = np.argsort(-(q @ vecs.T), axis=1)[:, :K]
    print(f"n={n} d={d} shards={len(graphs)}")
    for ef in (64, 128, 256, 512):
        t = time.perf_counter()
        top = merged_top(graphs, q, ef)
        ms = (time.perf_counter() - t) / QUERIES * 1e3
        recall = np.mean([len(set(a) & set(b)) / K for a, b in zip(top, exact)])
        print(f"efSearch={ef}: recall@{K} {recall:.3f}, {ms:.3f} ms/query (1 thread)")


if __name__ == "__main__":
    main()
