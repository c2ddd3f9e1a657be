"""Build time of a retrieval database against its size (issue 36): 10k, 100k, 1M chunks.

The corpora are synthetic (``attnlab data synth-facts``: pseudo-word filler and key=value facts,
prepared with the gpt2 tokenizer), sized by their number of facts; each size is built with the
index kinds given, on ``--workers`` workers, and the seconds of each stage, the peak memory of
the process and the load average of the machine are written to ``--out`` (JSON lines). The
exponent of time ~ n^a is fitted by least squares on log-log per kind, of wall
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


def main() -> None:
    from attnlab.data import TokenData
    from attnlab.data.retrieval import build_database
    from attnlab.data.retrieval_index import index_spec

    p = argparse.ArgumentParser()
    p.add_argument("--root", type=Path, required=True)
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    p.add_argument("--kinds", nargs="+", default=["hnsw:random", "bm25:words"])
    p.add_argument("--chunk-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    for n in a.sizes:
        t = time.perf_counter()
        data_dir = corpus(a.root, n, a.chunk_size)
        prep = time.perf_counter() - t
        chunks = len(TokenData.open(data_dir).train) // a.chunk_size
        for kind in a.kinds:
            k, _, enc = kind.partition(":")
            load0 = os.getloadavg()[0]
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
                "load_after": os.getloadavg()[0],
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "short": {s: db.short(s) for s in ("train", "val")},
            }
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
