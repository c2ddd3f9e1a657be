"""Decoding with live retrieval (RETRO §2.6): every time m new tokens complete a chunk, its k
neighbours are fetched from the database and every later token reads them.

Each step runs the whole prefix (no KV cache: CCA's memory changes with every completed chunk;
O(T^2) per token, fine for the short continuations of a lab). The retriever is a callable, so this
module stays below the data layer: ``attnlab.data.retrieval.Database.retriever()`` supplies one.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor, nn

from attnlab.model.generate import _pick

#: chunk tokens [m] -> neighbours [k, r] (token ids)
Retriever = Callable[[np.ndarray], np.ndarray]


def generate_with_retrieval(
    model: nn.Module,
    input_ids: Tensor,
    max_new_tokens: int,
    retrieve: Retriever | None,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    eos_id: int | None = None,
) -> tuple[Tensor, int]:
    """Continue ``input_ids`` [B, T] of a ``family = "retrieval"`` model; ``retrieve`` None
    decodes without neighbours. Returns (ids [B, T + n], number of retrieval calls)."""
    m = model.cfg.retrieval.chunk_size
    was = model.training
    model.eval()
    ids = input_ids
    rows: list[list[np.ndarray]] = [[] for _ in range(ids.shape[0])]
    calls = 0
    try:
        with torch.inference_mode():
            for _ in range(max_new_tokens):
                T = ids.shape[1]
                if retrieve is not None:
                    for b in range(ids.shape[0]):
                        while (
                            len(rows[b]) < T // m
                        ):  # a newly completed chunk: fetch its neighbours
                            j = len(rows[b])
                            rows[b].append(retrieve(ids[b, j * m : (j + 1) * m].cpu().numpy()))
                            calls += 1
                nb = None
                if retrieve is not None and m <= T:
                    nb = torch.as_tensor(np.stack([np.stack(r) for r in rows]), device=ids.device)
                logits = model(ids, neighbours=nb, last_logits_only=True).logits[:, -1]
                nxt = _pick(logits, temperature, top_k, generator)
                ids = torch.cat([ids, nxt], dim=1)
                if eos_id is not None and bool((nxt == eos_id).all()):
                    break
    finally:
        model.train(was)
    return ids, calls
