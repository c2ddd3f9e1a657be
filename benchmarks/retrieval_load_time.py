"""What `attnlab generate` pays to start retrieving from a stored database (issue 36): the
integrity check (first: every file hashed; later: one stat per file), the index library's import,
the index's load (wall and CPU seconds: the machine is shared), and one query, per database directory given. Prints one JSON line each.

    python benchmarks/retrieval_load_time.py /tmp/scale/n30000/retrieval/m32-k2-c32 ...
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np


def main() -> None:
    from attnlab.data import TokenData
    from attnlab.data.retrieval_index.integrity import CACHE, verify_database
    from attnlab.data.retrieval_index.live import import_backend

    p = argparse.ArgumentParser()
    p.add_argument("databases", nargs="+", type=Path)
    p.add_argument("--queries", type=int, default=20)
    a = p.parse_args()
    for directory in a.databases:
        data = TokenData.open(directory.parent.parent)
        (directory / CACHE).unlink(missing_ok=True)
        t = time.perf_counter()
        verify_database(directory, data)
        first = time.perf_counter() - t
        t = time.perf_counter()
        db = verify_database(directory, data)
        later = time.perf_counter() - t
        t = time.perf_counter()
        import_backend(db.index)
        imports = time.perf_counter() - t
        t, cpu = time.perf_counter(), time.process_time()
        live = db.retriever(data)
        load, load_cpu = time.perf_counter() - t, time.process_time() - cpu
        m, val = db.chunk_size, np.asarray(data.val)
        times = []
        for q in range(a.queries):
            t = time.perf_counter()
            live(val[q * m : (q + 1) * m])
            times.append(time.perf_counter() - t)
        row = {
            "database": str(directory),
            "kind": db.index.slug or "bm25-bigrams",
            "chunks": int(db.meta["database_chunks"]),
            "stored_index": db.stored_index,
            "check_first_s": first,
            "check_later_s": later,
            "import_s": imports,
            "load_s": load,
            "load_cpu_s": load_cpu,
            "query_ms_median": 1e3 * float(np.median(times)),
            "load_average": os.getloadavg()[0],
        }
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
