"""The stored index of a ``bm25-bigrams`` database, so decoding loads it instead of building it.

The build keeps bm25s' precomputed scores S [terms, chunks] (CSR: ``data``, ``indices``,
``indptr``) and each term as an integer code, in ``bigrams/`` beside ``train.npy``:

    code(a_b) = a 2^21 + b >= 0        code(a_b_c) = -(1 + a 2^42 + b 2^21 + c) < 0

(token ids below 2^21), ``codes.npy`` sorted with ``rows.npy`` the row of S of each code. A query
chunk's terms are looked up by binary search (no dictionary of millions of strings is rebuilt)
and scored as the build scored it, one sparse product ``q S`` (the same rows, the same float32
sums, so the same top k). Load: five memory-mapped arrays, milliseconds at any size; a query
costs O(terms log terms + postings + chunks) (the dense score row).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

DIR = "bigrams"
FILES = ("codes.npy", "rows.npy", "data.npy", "indices.npy", "indptr.npy")
_B = 1 << 21


def _save(path: Path, arr: np.ndarray) -> None:
    tmp = path.with_name(f".{path.stem}.tmp.npy")
    np.save(tmp, np.ascontiguousarray(arr))
    tmp.replace(path)


def term_code(term: str) -> int:
    """The integer code of a term ``"a_b"`` or ``"a_b_c"`` (token ids)."""
    ids = [int(x) for x in term.split("_")]
    if len(ids) == 2:
        return ids[0] * _B + ids[1]
    return -(1 + (ids[0] * _B + ids[1]) * _B + ids[2])


def chunk_codes(chunk: np.ndarray) -> np.ndarray:
    """The codes of a chunk's bigrams and trigrams, each occurrence once (``chunk_terms``)."""
    t = np.asarray(chunk, dtype=np.int64)
    bi = t[:-1] * _B + t[1:]
    tri = -(1 + (t[:-2] * _B + t[1:-1]) * _B + t[2:])
    return np.concatenate([bi, tri])


def save(directory: Path, scores: Any, vocab: dict[str, int]) -> list[str]:
    """Write S (a CSR matrix [terms, chunks]) and the codes of ``vocab`` (term -> row) to
    ``directory/bigrams``; returns the files' names relative to ``directory``."""
    out = directory / DIR
    out.mkdir(parents=True, exist_ok=True)
    terms = [(t, row) for t, row in vocab.items() if t]  # bm25s' own "" (padding) is no term
    codes = np.fromiter((term_code(t) for t, _ in terms), dtype=np.int64, count=len(terms))
    rows = np.fromiter((row for _, row in terms), dtype=np.int64, count=len(terms))
    order = np.argsort(codes, kind="stable")
    arrays = {
        "codes.npy": codes[order],
        "rows.npy": rows[order],
        "data.npy": np.asarray(scores.data, dtype=np.float32),
        "indices.npy": np.asarray(scores.indices, dtype=np.int32),
        "indptr.npy": np.asarray(scores.indptr, dtype=np.int64),
    }
    for name, arr in arrays.items():
        _save(out / name, arr)
    return [f"{DIR}/{name}" for name in FILES]


class StoredBigrams:
    """The index in ``directory/bigrams``, memory-mapped; ``scores(chunk)`` is the build's row."""

    def __init__(self, directory: Path, n_chunks: int) -> None:
        import scipy.sparse as sp

        d = directory / DIR
        self.codes = np.load(d / "codes.npy", mmap_mode="r")
        self.rows = np.load(d / "rows.npy", mmap_mode="r")
        indptr = np.load(d / "indptr.npy", mmap_mode="r")
        self.S = sp.csr_matrix(
            (
                np.load(d / "data.npy", mmap_mode="r"),
                np.load(d / "indices.npy", mmap_mode="r"),
                indptr,
            ),
            shape=(len(indptr) - 1, n_chunks),
        )

    def scores(self, chunk: np.ndarray) -> np.ndarray:
        """float32 [chunks]: the BM25 score of every database chunk for this query chunk."""
        import scipy.sparse as sp

        q = chunk_codes(chunk)
        at = np.searchsorted(self.codes, q)
        hit = at < len(self.codes)
        hit[hit] = self.codes[at[hit]] == q[hit]
        cols = np.sort(np.asarray(self.rows[at[hit]], dtype=np.int64))
        ones = np.ones(len(cols), dtype=np.float32)
        qm = sp.csr_matrix(
            (ones, (np.zeros(len(cols), dtype=np.int64), cols)),
            shape=(1, self.S.shape[0]),
            dtype=np.float32,
        )
        return np.asarray((qm @ self.S).todense(), dtype=np.float32)[0]


__all__ = ["DIR", "FILES", "StoredBigrams", "chunk_codes", "save", "term_code"]
