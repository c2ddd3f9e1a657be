"""Which index retrieves planted facts best (issue 36): recall of the validation statements of
an ``attnlab data synth-facts`` corpus for every index kind and encoder (``fact_recall``: ``key``,
the chunk holding the key gets a neighbour stating the fact; ``reading``, the neighbours read by
the token before the answer do), with each build's seconds and the SmolLM2 encoders' tokens/s.

    python benchmarks/retrieval_fact_recall.py --root /tmp/facts --tokenizers bytes gpt2 \\
        --facts 200 --chunk-size 16 --out recall.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from pathlib import Path

KINDS = [
    ("bm25-bigrams", "bigrams"),
    ("bm25", "words"),
    ("bm25", "unigrams"),
    ("hnsw", "random"),
    ("hnsw", "smollm2-table"),
    ("hnsw", "smollm2"),
]


def main() -> None:
    from attnlab.data import TokenData
    from attnlab.data.retrieval import build_database
    from attnlab.data.retrieval_index import index_spec
    from attnlab.data.retrieval_index.fact_recall import fact_recall
    from attnlab.data.synth_facts import FactsSpec, generate, load_statements

    p = argparse.ArgumentParser()
    p.add_argument("--root", type=Path, required=True)
    p.add_argument("--tokenizers", nargs="+", default=["bytes", "gpt2"])
    p.add_argument("--facts", type=int, default=200)
    p.add_argument("--chunk-size", type=int, default=16)
    p.add_argument("--neighbours", type=int, default=2)
    p.add_argument("--kinds", nargs="+", default=[f"{k}:{e}" for k, e in KINDS])
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    for tok in a.tokenizers:
        data_dir = a.root / f"{tok}-f{a.facts}"
        if not data_dir.exists():
            generate(data_dir, FactsSpec(facts=a.facts), tokenizer=tok)
        data = TokenData.open(data_dir)
        st = load_statements(data_dir, "val")
        for kind in a.kinds:
            k, _, enc = kind.partition(":")
            t = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                db = build_database(
                    data_dir,
                    chunk_size=a.chunk_size,
                    neighbours=a.neighbours,
                    workers=2,
                    index=index_spec(k, enc),
                )
            row = {
                "tokenizer": tok,
                "kind": kind,
                "chunks": len(db.train),
                **fact_recall(db, data, st),
                "seconds": time.perf_counter() - t,
                "timings": db.timings,
                "load": os.getloadavg()[0],
            }
            print(json.dumps(row), flush=True)
            with a.out.open("a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
