"""BM25 top-k with a cost per query that does not grow with the database: impact-ordered,
pruned postings and a bounded number of query terms, as search engines bound a query.

bm25s stores every (term, chunk) score ``s(t, c) = idf(t) tf (k1 + 1) / (tf + k1 (1 - b + b
|c| / avgdl))`` in a term -> chunks matrix; a chunk's score for query q is ``sum_t n_q(t) s(t,
c)`` (``n_q(t)``: the term's count in the query). Its ``retrieve`` adds the query's postings
into a dense row over all n chunks and scans it for the top k: O(n) per query, O(n^2) for a
build that queries every chunk. Here:

* **query terms**: a query keeps its ``T`` distinct terms of highest idf (lowest document
  frequency; ties to the lower term id): the rare words that identify a passage;
* **postings**: each term keeps the ``P`` chunks where it scores highest (ties to the lower
  chunk), once, when the index is loaded (static index pruning, Carmel et al. 2001);
* a block of queries is scored in one pass: the kept postings gathered, summed per (query,
  chunk) in float64, ranked by (score desc, chunk asc) per query.

A query then touches at most ``T P`` postings, so a block of B queries costs O(B T P log(B T P))
whatever n; the leakage rule (:mod:`.leakage`) is applied to the whole ranked candidate list (no
over-fetch, no second search). The result is exact BM25 when a query has at most T distinct
terms, each in at most P chunks; otherwise a chunk outside every kept posting list is missed (the
build scaling results report recall against the exact top k). Pruning costs O(nnz log nnz)
once per load (nnz: the index's postings).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Pruned:
    """Each term's kept postings (chunk ids and scores, best first), its full document
    frequency and the database size."""

    indptr: np.ndarray
    chunks: np.ndarray
    scores: np.ndarray
    df: np.ndarray
    n_chunks: int


def prune(scores: dict, postings: int) -> Pruned:
    """The ``postings`` best chunks of every term of a bm25s score matrix (``BM25.scores``:
    ``data``, ``indices``, ``indptr`` over terms, ``num_docs``)."""
    indptr = np.asarray(scores["indptr"], dtype=np.int64)
    data = np.asarray(scores["data"], dtype=np.float32)
    chunks = np.asarray(scores["indices"], dtype=np.int64)
    df = np.diff(indptr)
    term = np.repeat(np.arange(len(df), dtype=np.int64), df)
    order = np.lexsort((chunks, -data, term))  # term stays sorted: term[order] == term
    rank = np.arange(len(order), dtype=np.int64) - indptr[term]
    keep = order[rank < postings]  # the first ``postings`` of each term's run
    kept = np.minimum(df, postings)
    new_ptr = np.concatenate([[0], np.cumsum(kept)]).astype(np.int64)
    return Pruned(new_ptr, chunks[keep], data[keep], df, int(scores["num_docs"]))


def _query_terms(queries: list[list[int]], df: np.ndarray, limit: int):
    """(query, term, count) of every query's ``limit`` distinct terms of lowest df."""
    lens = np.fromiter((len(q) for q in queries), dtype=np.int64, count=len(queries))
    flat = np.fromiter((t for q in queries for t in q), dtype=np.int64, count=int(lens.sum()))
    qid = np.repeat(np.arange(len(queries), dtype=np.int64), lens)
    pairs, counts = np.unique(qid * len(df) + flat, return_counts=True)
    qid, term = pairs // len(df), pairs % len(df)
    order = np.lexsort((term, df[term], qid))
    qid, term, counts = qid[order], term[order], counts[order]
    starts = np.searchsorted(qid, qid, side="left")
    keep = np.arange(len(qid)) - starts < limit
    return qid[keep], term[keep], counts[keep]


def _gather(index: Pruned, qid: np.ndarray, term: np.ndarray, counts: np.ndarray):
    """(query, chunk, score contribution) of every kept posting of every (query, term)."""
    lo, hi = index.indptr[term], index.indptr[term + 1]
    lens = hi - lo
    total = int(lens.sum())
    offsets = np.repeat(lo - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens)
    at = offsets + np.arange(total, dtype=np.int64)
    rep = np.repeat(np.arange(len(term)), lens)
    return qid[rep], index.chunks[at], index.scores[at].astype(np.float64) * counts[rep]


def search(
    index: Pruned,
    queries: list[list[int]],
    k: int,
    first: np.ndarray,
    last: np.ndarray,
    query_terms: int,
) -> np.ndarray:
    """Neighbours [len(queries), k] (-1 padded): per query the k best chunks outside [first_i,
    last_i) among those its kept terms' kept postings reach (a score > 0)."""
    out = np.full((len(queries), k), -1, dtype=np.int64)
    if not any(queries):
        return out
    qid, chunk, score = _gather(index, *_query_terms(queries, index.df, query_terms))
    key = qid * index.n_chunks + chunk
    order = np.argsort(key, kind="stable")
    key, score = key[order], score[order]
    heads = np.concatenate([[True], key[1:] != key[:-1]])
    total = np.add.reduceat(score, np.nonzero(heads)[0]) if len(key) else score
    key = key[heads]
    qid, chunk = key // index.n_chunks, key % index.n_chunks
    allowed = (chunk < first[qid]) | (chunk >= last[qid])
    qid, chunk, total = qid[allowed], chunk[allowed], total[allowed]
    rank = np.lexsort((chunk, -total, qid))
    qid, chunk = qid[rank], chunk[rank]
    pos = np.arange(len(qid)) - np.searchsorted(qid, qid, side="left")
    top = pos < k
    out[qid[top], pos[top]] = chunk[top]
    return out
