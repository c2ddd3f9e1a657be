"""Build time of a retrieval database against its size (issue 36): 10k, 100k, 1M chunks.

The corpora are synthetic (``attnlab data synth-facts``: pseudo-word filler and key=value facts,
prepared with the gpt2 tokenizer), sized by their number of facts; each size is built with the
index kinds given, on ``--workers`` workers, and the seconds of each stage, the CPU seconds, the
peak memory (this process and its largest worker) and the load average of the machine are
written to ``--out`` (JSON lines). After each build (not timed), the recall of its validation
neighbours against exact search on ``--sample`` validation chunks (tie-aware: a neighbour counts
when its exact score reaches the exact k-th best) and the planted-fact recall (key) on up to 2,000
statements. The exponent of time ~ n^a is fitted by least squares on log-log per kind, of wall
and of CPU seconds (the machine is shared: CPU seconds move less with its load).

    python benchmarks/retrieval_build_scaling.py --root /tmp/scale --sizes 10000 100000 1000000 \\
        --kinds hnsw:random bm25:words --out scaling.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
import warnings
from pathlib import Path

import numpy as np


def corpus(root: Path, chunks: int, m: int) -> Path:
    """A prepared synthetic corpus of about ``chunks`` chunks of m gpt2 tokens."""
    from attnlab.data.synth_facts import FactsSpec, generate

    out = root / f"n{chunks}"
    if not (out / "facts").exists():
        # about 90 gpt2 tokens per training document of 2 facts, 3 mentions per fact
        facts = max(10, round(chunks * m / 90 * 2 / 3 / 1.25))
        generate(out, FactsSpec(facts=facts, filler_sentences=2), tokenizer="gpt2")
    return out


def _cpu() -> float:
    """CPU seconds of this process and its finished children (the bm25 workers)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _exact_dense(db, data, rows: np.ndarray, got: np.ndarray) -> float:
    """Tie-aware recall of ``got`` against exact inner-product search over every chunk."""
    from attnlab.data.retrieval_index.encoders import RandomProjection

    spec, m, k = db.index, db.chunk_size, got.shape[1]
    enc = RandomProjection(np.load(db.directory / "idf.npy"), spec.dim)
    q = enc(rows)
    train = np.asarray(data.train)
    n = len(train) // m
    best = np.full((len(q), k), -np.inf)
    mine = np.zeros(got.shape)
    for lo in range(0, n, 65536):
        x = enc(train[lo * m : min(lo + 65536, n) * m].reshape(-1, m))
        sims = q @ x.T
        best = np.sort(np.concatenate([best, np.sort(sims, axis=1)[:, -k:]], axis=1), axis=1)
        best = best[:, -k:]
        inside = (got >= lo) & (got < lo + len(x))
        rows_i, cols_i = np.nonzero(inside)
        mine[rows_i, cols_i] = sims[rows_i, got[rows_i, cols_i] - lo]
    return float(np.mean((got >= 0) & (mine >= best[:, :1] - 1e-6)))


def _exact_bm25(db, data, rows: np.ndarray, got: np.ndarray) -> float:
    """Tie-aware recall of ``got`` against bm25s' exact scores (a dense row per query)."""
    from attnlab.data.retrieval_index import bm25, terms

    bm = bm25.load(db.directory / "bm25")
    decode = data.tokenizer.decode if db.index.encoder == "words" else None
    queries = terms.query_ids(rows.reshape(-1), rows.shape[1], decode, bm.vocab_dict)
    hits = []
    for q, g in zip(queries, got, strict=True):
        if not q:
            continue
        row = np.asarray(bm.get_scores_from_ids(q), dtype=np.float64)
        kth = np.sort(row)[-len(g)]
        hits.extend((j >= 0 and row[j] >= kth * (1 - 1e-5) and row[j] > 0) for j in g)
    return float(np.mean(hits))


def recall(db, data_dir: Path, sample: int) -> dict:
    """Recall against exact search on ``sample`` validation chunks, and planted-fact recall."""
    from attnlab.data import TokenData
    from attnlab.data.retrieval_index.fact_recall import fact_recall
    from attnlab.data.synth_facts import load_statements

    data = TokenData.open(data_dir)
    m = db.chunk_size
    val = np.asarray(data.val)
    pick = np.sort(np.random.default_rng(0).choice(len(val) // m, sample, replace=False))
    rows = np.stack([val[c * m : (c + 1) * m] for c in pick]).astype(np.int64)
    got = np.asarray(db.val)[pick]
    exact = _exact_bm25 if db.index.kind == "bm25" else _exact_dense
    st = load_statements(data_dir, "val")
    st = st[np.sort(np.random.default_rng(0).permutation(len(st))[:2000])]
    return {"recall_vs_exact": exact(db, data, rows, got), "facts": fact_recall(db, data, st)}


def _build(a, data_dir: Path, n: int, chunks: int, kind: str, prep: float) -> dict:
    from attnlab.data.retrieval import build_database
    from attnlab.data.retrieval_index import index_spec

    k, _, enc = kind.partition(":")
    load0 = os.getloadavg()
    cpu0 = _cpu()
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        db = build_database(
            data_dir,
            chunk_size=a.chunk_size,
            neighbours=2,
            workers=a.workers,
            restart=True,
            index=index_spec(k, enc or None),
        )
    row = {
        "kind": kind,
        "target": n,
        "chunks": chunks,
        "seconds": time.perf_counter() - t,
        "cpu_seconds": _cpu() - cpu0,
        "stages": db.timings,
        "prepare_s": prep,
        "load_before": load0,
        "load_after": os.getloadavg(),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "peak_worker_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
        "short": {s: db.short(s) for s in ("train", "val")},
        "workers": a.workers,
        "spec": db.index.model_dump(),
    }
    if a.sample:
        row.update(recall(db, data_dir, a.sample))
    return row


def main() -> None:
    from attnlab.data import TokenData

    p = argparse.ArgumentParser()
    p.add_argument("--root", type=Path, required=True)
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    p.add_argument("--kinds", nargs="+", default=["hnsw:random", "bm25:words"])
    p.add_argument("--chunk-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--sample", type=int, default=200, help="validation chunks for recall (0: none)")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    for n in a.sizes:
        t = time.perf_counter()
        data_dir = corpus(a.root, n, a.chunk_size)
        prep = time.perf_counter() - t
        chunks = len(TokenData.open(data_dir).train) // a.chunk_size
        for kind in a.kinds:
            row = _build(a, data_dir, n, chunks, kind, prep)
            print(json.dumps(row), flush=True)
            with a.out.open("a") as f:
                f.write(json.dumps(row) + "\n")
    rows = [json.loads(x) for x in a.out.read_text().splitlines()]
    for kind in a.kinds:
        for what in ("seconds", "cpu_seconds"):
            pts = [(r["chunks"], r[what]) for r in rows if r["kind"] == kind and what in r]
            if len(pts) >= 2:
                x, y = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
                fit = np.polyfit(x, y, 1)[0]
                print(f"{kind}: {what} ~ n^{fit:.2f} over {len(pts)} sizes")


if __name__ == "__main__":
    main()
