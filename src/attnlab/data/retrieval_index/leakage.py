"""RETRO's no-leakage rule, per reading token, for every index kind and at any size.

Chunk c of the training split is tokens [c m, (c+1) m). Chunked cross-attention (``model/parts/
cross_attention_cca.py``) lets token p read the neighbours of chunk ``(p + 1) // m - 1``, so chunk
c's neighbours are read by tokens (c+1) m - 1 .. (c+2) m - 2 (chunk c's last token and chunk c+1
but its last), which predict tokens (c+1) m .. (c+2) m - 1 (all of chunk c+1). A neighbour is
excluded when it shares a document with any of these tokens or with chunk c itself (RETRO's own
rule, kept): with the token stream's document ids ``doc``, chunk c may not retrieve from documents
``doc[c m] .. doc[min((c+2) m, n) - 1]``. A database chunk j with its continuation spans
documents ``doc[j m] .. doc[min(j m + r, n) - 1]``. Both ranges grow with c and j, so the
excluded database chunks of query c are one run [first_c, last_c), found by two binary searches.

Validation chunks retrieve from the training split, whose documents they never share: nothing is
excluded. An index returns candidates best first; :func:`pick` drops the excluded ones and keeps
k. Over-fetching k + F candidates finds k allowed ones unless more than F of the best are
excluded; then the caller fetches again through the index's filter (bm25s' ``weight_mask``,
faiss' ``IDSelector``), which is exact. Cost: O(chunks) for the document ids, O(log n) per query.
"""

from __future__ import annotations

import numpy as np


def document_ids(tokens: np.ndarray, eos_id: int) -> np.ndarray:
    """Document number of every token (documents end with eos; the eos belongs to its document)."""
    ends = np.asarray(tokens) == eos_id
    return np.concatenate([[0], np.cumsum(ends)[:-1]]).astype(np.int64)


def database_documents(docs: np.ndarray, m: int, r: int) -> tuple[np.ndarray, np.ndarray]:
    """First and last document of every database chunk with its continuation (r tokens)."""
    n_tok = len(docs)
    starts = np.arange(n_tok // m, dtype=np.int64) * m
    return docs[starts], docs[np.minimum(starts + r, n_tok) - 1]


def reading_documents(docs: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """First and last document of the tokens of training chunk c and of the tokens that read or
    are predicted from its neighbours: tokens [c m, min((c+2) m, n))."""
    n_tok = len(docs)
    starts = np.arange(n_tok // m, dtype=np.int64) * m
    return docs[starts], docs[np.minimum(starts + 2 * m, n_tok) - 1]


def excluded_ranges(
    q_lo: np.ndarray, q_hi: np.ndarray, db_lo: np.ndarray, db_hi: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """[first, last) of the database chunks whose documents meet [q_lo, q_hi], per query."""
    first = np.searchsorted(db_hi, q_lo, side="left")
    last = np.maximum(np.searchsorted(db_lo, q_hi, side="right"), first)
    return first.astype(np.int64), last.astype(np.int64)


def training_exclusions(
    train: np.ndarray, eos_id: int, m: int, r: int
) -> tuple[np.ndarray, np.ndarray]:
    """[first, last) of the excluded database chunks of every training query chunk."""
    docs = document_ids(train, eos_id)
    return excluded_ranges(*reading_documents(docs, m), *database_documents(docs, m, r))


def pick(
    candidates: np.ndarray, scores: np.ndarray, first: int, last: int, k: int
) -> tuple[np.ndarray, int]:
    """The k best allowed candidates (higher score first, ties to the lower chunk), -1 padded,
    and how many allowed candidates there were. Invalid candidates are < 0."""
    cand = np.asarray(candidates, dtype=np.int64)
    sc = np.asarray(scores, dtype=np.float64)
    ok = (cand >= 0) & ((cand < first) | (cand >= last)) & np.isfinite(sc)
    cand, sc = cand[ok], sc[ok]
    order = np.lexsort((cand, -sc))[:k]
    out = np.full(k, -1, dtype=np.int64)
    out[: len(order)] = cand[order]
    return out, int(ok.sum())
