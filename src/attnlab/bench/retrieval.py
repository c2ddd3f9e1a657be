"""Benchmarking a retrieval model (``model.family = "retrieval"``): model time with neighbours,
retrieval time apart.

Model speed does not depend on which tokens the neighbours hold, so the timed model reads
synthetic neighbour ids of the right shape ([B, T // m, k, r], each chunk's fixed;
:class:`WithNeighbours`), in training, prefill and decoding alike (decoding with the K/V cache,
which keeps each completed chunk's encoded neighbours, when the parts declare it exact). The retrieval cost is measured on its own (:func:`measure_retrieval`):
the BM25 lookup of one chunk (query terms, sparse scores against every database chunk, top k,
neighbour tokens) timed per chunk over a database built from ``--data`` (a prepared data folder's
training tokens) or, without it, from synthetic Zipf-distributed tokens; the index build is timed
once. Decoding with live retrieval costs the model's decode time plus one lookup per m tokens.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn


class WithNeighbours(nn.Module):
    """A retrieval model that reads synthetic neighbours of the right shape on every call (the
    model's own attributes stay reachable: ``cfg``, ``param_groups``, ``flops_per_token``)."""

    def __getattr__(self, name: str):
        """The model's own attributes (``position_limit``, ``mask_class``, ...) stay reachable."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["inner"], name)

    def __init__(self, model: nn.Module, seed: int = 0) -> None:
        super().__init__()
        self.inner = model
        self.cfg = model.cfg
        self.position_limit = getattr(model, "position_limit", None)  # read by generate
        self.seed = seed
        self._nb: dict[tuple, Tensor] = {}

    @property
    def supports_cache(self) -> bool:
        """The model's own declaration (cached decoding keeps each chunk's neighbours)."""
        return bool(self.inner.supports_cache)

    def new_cache(self, *args, **kw):
        return self.inner.new_cache(*args, **kw)

    def neighbours(self, batch: int, end: int, device: torch.device) -> Tensor:
        """[B, max(1, end // m), k, r] token ids; chunk j's the same at every call (a database
        lookup's are), so cached decoding and full forwards read the same neighbours."""
        r = self.cfg.retrieval
        C = max(1, end // r.chunk_size)
        have = self._nb.get((batch, device))
        if have is None or have.shape[1] < C:
            rows = []
            for j in range(C):
                gen = torch.Generator().manual_seed(self.seed + 1000 * j + batch)
                shape = (batch, 1, r.neighbours, r.neighbour_len)
                rows.append(torch.randint(0, self.cfg.vocab_size, shape, generator=gen))
            have = torch.cat(rows, 1).to(device)
            self._nb[(batch, device)] = have
        return have[:, :C]

    def forward(self, input_ids: Tensor, targets: Tensor | None = None, **kw):
        kw.pop("memory", None)
        cache = kw.get("cache")
        end = input_ids.shape[1] + (cache.length if cache is not None else 0)
        nb = self.neighbours(input_ids.shape[0], end, input_ids.device)
        return self.inner(input_ids, targets, neighbours=nb, **kw)

    def param_groups(self, weight_decay: float) -> list[dict]:
        return self.inner.param_groups(weight_decay)

    def flops_per_token(self, seq_len: int) -> int:
        return self.inner.flops_per_token(seq_len)

    def aux_losses(self):
        return self.inner.aux_losses()


@dataclass
class RetrievalRow:
    """The BM25 lookup of one chunk, timed apart from the model."""

    source: str
    database_chunks: int
    chunk_size: int
    neighbours: int
    index_build_s: float
    lookup_ms_per_chunk: float
    lookups: int
    #: the lookups of one --seq-len window (T // m chunks), in ms
    ms_per_window: float

    def to_dict(self) -> dict:
        return asdict(self)


def synthetic_tokens(n_tokens: int, vocab: int, seed: int = 0) -> np.ndarray:
    """Zipf-distributed token ids (a text-like spread of term frequencies for BM25)."""
    rng = np.random.default_rng(seed)
    ranks = rng.zipf(1.2, size=n_tokens)
    return ((ranks - 1) % vocab).astype(np.int64)


def measure_retrieval(
    cfg, seq_len: int, data_dir: str | Path | None = None, lookups: int = 64
) -> RetrievalRow:
    """Time ``lookups`` BM25 lookups of chunks of the model's chunk size against a database of
    the prepared ``data_dir``'s training tokens, or of 200,000 synthetic tokens without it."""
    from attnlab.data.retrieval import live_retriever

    r = cfg.model.retrieval
    m, k, length = r.chunk_size, r.neighbours, r.neighbour_len
    if data_dir is not None:
        from attnlab.data import TokenData

        data = TokenData.open(data_dir)
        train, eos, source = np.asarray(data.train), data.eos_id, f"--data {data_dir}"
    else:
        train = synthetic_tokens(200_000, cfg.model.vocab_size)
        eos, source = 0, "synthetic (200,000 Zipf tokens)"
    t0 = time.perf_counter()
    retrieve = live_retriever(train, m, k, length, eos)
    build_s = time.perf_counter() - t0
    n_chunks = len(train) // m
    rng = np.random.default_rng(1)
    queries = [train[c * m : (c + 1) * m] for c in rng.integers(0, n_chunks, size=lookups)]
    retrieve(queries[0])  # warm-up
    times = []
    for q in queries:
        t = time.perf_counter()
        nb = retrieve(q)
        times.append(time.perf_counter() - t)
    assert nb.shape == (k, length)
    per = statistics.median(times) * 1e3
    return RetrievalRow(
        source=source,
        database_chunks=n_chunks,
        chunk_size=m,
        neighbours=k,
        index_build_s=build_s,
        lookup_ms_per_chunk=per,
        lookups=lookups,
        ms_per_window=per * (seq_len // m),
    )
