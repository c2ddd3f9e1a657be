"""Decoding with live retrieval (RETRO §2.6): every time m new tokens complete a chunk, its k
neighbours are fetched from the database and every later token reads them.

With the K/V cache a step runs the new token alone: the cache keeps the decoder's keys and
values, each completed chunk's encoded neighbours and each CCA layer's keys and values of them,
so every chunk's neighbours are encoded and projected once (``use_cache=False``, or a part that
does not declare the cache exact: the whole prefix every step, O(T^2) per token). The retriever
is a callable, so this module stays below the data layer: ``attnlab.data.retrieval.Database.retriever()`` supplies one.
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
    use_cache: bool = True,
) -> tuple[Tensor, int]:
    """Continue ``input_ids`` [B, T] of a ``family = "retrieval"`` model; ``retrieve`` None
    decodes without neighbours. With ``use_cache`` (and parts that declare it exact) each step
    runs the new token alone through the K/V cache; else the whole prefix. Returns (ids
    [B, T + n], number of retrieval calls)."""
    m = model.cfg.retrieval.chunk_size
    was = model.training
    model.eval()
    ids = input_ids
    rows: list[list[np.ndarray]] = [[] for _ in range(ids.shape[0])]
    calls = 0
    cache = None
    if use_cache and model.supports_cache:
        cache = model.new_cache(ids.shape[0], ids.shape[1] + max_new_tokens)
    try:
        with torch.inference_mode():
            for _ in range(max_new_tokens):
                calls += _fetch(ids, rows, m, retrieve)
                nb = None
                if retrieve is not None and m <= ids.shape[1]:
                    nb = torch.as_tensor(np.stack([np.stack(r) for r in rows]), device=ids.device)
                new = ids if cache is None else ids[:, cache.length :]
                out = model(new, cache=cache, neighbours=nb, last_logits_only=True)
                nxt = _pick(out.logits[:, -1], temperature, top_k, generator)
                ids = torch.cat([ids, nxt], dim=1)
                if eos_id is not None and bool((nxt == eos_id).all()):
                    break
    finally:
        model.train(was)
    return ids, calls


def _fetch(ids: Tensor, rows: list[list[np.ndarray]], m: int, retrieve: Retriever | None) -> int:
    """The neighbours of each newly completed chunk of every row appended to ``rows``; returns
    how many retrieval calls that took."""
    if retrieve is None:
        return 0
    calls = 0
    for b in range(ids.shape[0]):
        while len(rows[b]) < ids.shape[1] // m:  # a newly completed chunk
            j = len(rows[b])
            rows[b].append(retrieve(ids[b, j * m : (j + 1) * m].cpu().numpy()))
            calls += 1
    return calls
