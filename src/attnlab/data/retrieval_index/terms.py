"""The BM25 terms of a chunk: its decoded lower-case words, or its token ids.

``words``: the chunk's tokens decoded by the data's own tokenizer, lower-cased, split into runs
of word characters (``\\w+``). Works for every tokenizer (byte-level too, where a token is a
byte and a unigram says little). ``unigrams``: the token ids themselves (for a subword tokenizer
close to words; nothing to decode). A chunk cut mid-word gives a word fragment, like RETRO's own
fixed-length chunks.

:func:`term_ids` maps every chunk of a token array to term ids in one pass, streaming in blocks:
a provisional id per new term, the document frequency per term, then ids renumbered in sorted
term order (so the vocabulary, and every float sum over it, does not depend on the order chunks
were seen) with stop terms (in more than ``max(1000, chunks / 10)`` chunks) dropped. Memory:
the term ids of all chunks (int32, about m ids per chunk) and the vocabulary.
Cost: one decode and one regex pass per chunk.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import numpy as np

_WORD = re.compile(r"\w+")
STOP_FLOOR = 1000  # a term in more chunks than max(STOP_FLOOR, chunks / STOP_SHARE) is a stop term
STOP_SHARE = 10


def chunk_terms(decode: Callable[[Sequence[int]], str] | None, chunk: np.ndarray) -> list[str]:
    """The terms of one chunk: its words (``decode`` given) or its token ids as strings."""
    if decode is None:
        return [str(int(t)) for t in chunk]
    return _WORD.findall(decode(chunk.tolist()).lower())


def stop_limit(n_chunks: int) -> int:
    """The document frequency above which a term is a stop term."""
    return max(STOP_FLOOR, n_chunks // STOP_SHARE)


def term_ids(
    tokens: np.ndarray, m: int, decode: Callable[[Sequence[int]], str] | None, block: int = 8192
) -> tuple[list[list[int]], dict[str, int]]:
    """Term ids of each of the ``len(tokens) // m`` chunks (stop terms dropped, repeats kept)
    and the vocabulary term -> id (ids in sorted term order)."""
    n = len(tokens) // m
    provisional: dict[str, int] = {}
    flat: list[np.ndarray] = []
    lengths = np.zeros(n, dtype=np.int64)
    df: list[int] = []
    for lo in range(0, n, block):
        hi = min(lo + block, n)
        rows = np.asarray(tokens[lo * m : hi * m]).reshape(hi - lo, m)
        for i, row in enumerate(rows):
            ids = [provisional.setdefault(t, len(provisional)) for t in chunk_terms(decode, row)]
            df.extend([0] * (len(provisional) - len(df)))
            for t in set(ids):
                df[t] += 1
            lengths[lo + i] = len(ids)
            flat.append(np.asarray(ids, dtype=np.int32))
    limit = stop_limit(n)
    terms = sorted(t for t, i in provisional.items() if df[i] <= limit)
    vocab = {t: j for j, t in enumerate(terms)}
    remap = np.full(len(provisional), -1, dtype=np.int64)
    for t, i in provisional.items():
        remap[i] = vocab.get(t, -1)
    ints = list(range(len(vocab)))  # shared int objects: the lists below hold references only
    out: list[list[int]] = []
    for ids in flat:
        new = remap[ids]
        out.append([ints[j] for j in new[new >= 0].tolist()])
    return out, vocab


def query_ids(
    tokens: np.ndarray, m: int, decode: Callable[[Sequence[int]], str] | None, vocab: dict[str, int]
) -> list[list[int]]:
    """Term ids of each chunk of ``tokens`` in an existing vocabulary (unknown terms dropped)."""
    n = len(tokens) // m
    rows = np.asarray(tokens[: n * m]).reshape(n, m)
    return [[vocab[t] for t in chunk_terms(decode, row) if t in vocab] for row in rows]
