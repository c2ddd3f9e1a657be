"""Tokens per second of the ``smollm2`` retrieval encoder (SmolLM2-135M's mean-pooled last hidden
states), apart from any index (issue 36: on CPU a transformer encoder dominates the build).

    python benchmarks/retrieval_encoder_rate.py --data data/facts --chunks 512 --chunk-size 16

Prints one JSON line: SmolLM2 tokens encoded, wall and CPU seconds of encoding, the model's load
time and the machine's load average.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np


def main() -> None:
    import torch

    from attnlab.data import TokenData
    from attnlab.data.retrieval_index.encoders import SmolLM2

    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--chunks", type=int, default=512)
    p.add_argument("--chunk-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    data = TokenData.open(a.data)
    t = time.perf_counter()
    enc = SmolLM2(data.tokenizer.decode, pooled=True)
    load = time.perf_counter() - t
    m = a.chunk_size
    rows = np.asarray(data.train[: a.chunks * m], dtype=np.int64).reshape(-1, m)
    load0, cpu0 = os.getloadavg()[0], time.process_time()
    enc(rows)
    row = {
        "encoder": "smollm2 (mean-pooled last hidden states)",
        "chunks": len(rows),
        "chunk_size": m,
        "smollm2_tokens": enc.tokens,
        "encode_s": enc.seconds,
        "tokens_per_s": enc.tokens_per_s,
        "cpu_s": time.process_time() - cpu0,
        "model_load_s": load,
        "load_before": load0,
        "load_after": os.getloadavg()[0],
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    print(json.dumps(row))


if __name__ == "__main__":
    main()
