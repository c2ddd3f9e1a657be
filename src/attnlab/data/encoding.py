"""Encode chunks of documents on every core, in order: the parallel half of ``prepare``.

A chunk is a list of documents as UTF-8 bytes (about ``CHUNK_BYTES`` of text). Encoding one gives
``EncodedChunk``: each document's split hash ``u`` (:func:`attnlab.data.split.document_u`), the
token ids of all documents back to back, each followed by end-of-text (already in the shard
dtype), and each document's token count. The result depends only on the chunk, so encoding
chunks in worker processes and writing them in order gives the same bytes as one process.

``encode_chunks(chunks, tokenizer, workers)`` yields results in input order. ``workers == 1``
encodes in this process, one document at a time (the single-core reference). ``workers > 1``
starts that many processes (forked on Linux, spawned elsewhere), each holding a copy of the
tokenizer and encoding on one thread; at most ``2 * workers`` chunks are in flight, so memory stays bounded by a few
chunks whatever the corpus size. Every tokenizer kind is parallel this way, including the Python
ones; the main process is left free to read the corpus and write the shards.

Cost: tokenizer-bound; per chunk, a pickle of its text to a worker and of its ids back (memory
copies, small next to encoding). Starting spawned workers takes about a second (imports and
the tokenizer's unpickling), so small inputs are encoded in process.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnlab.base.errors import UserError
from attnlab.data.split import document_u
from attnlab.data.tokenizer import Tokenizer

CHUNK_BYTES = 1 << 20  # about 1 MB of text per chunk
_TOKENIZER: Tokenizer | None = None  # the worker process's copy


@dataclass
class EncodedChunk:
    """One chunk's documents: hash positions, concatenated ids (shard dtype), tokens per doc."""

    u: np.ndarray  # float64 [n_docs]
    ids: np.ndarray  # shard dtype [sum(lengths)]
    lengths: np.ndarray  # int64 [n_docs], each including its end-of-text
    text_bytes: int


def default_workers() -> int:
    """Every core this process may run on (``os.sched_getaffinity`` where it exists)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def encode_chunk(
    tok: Tokenizer, docs: list[bytes], split_seed: int, dtype: np.dtype
) -> EncodedChunk:
    """Hash and encode one chunk on this thread (see the module docstring)."""
    u = np.fromiter((document_u(d, split_seed) for d in docs), dtype=np.float64, count=len(docs))
    ids, lengths = tok.encode_chunk([d.decode("utf-8") for d in docs])
    if ids.size and (ids.min() < 0 or ids.max() >= tok.vocab_size):
        raise UserError(
            f"tokenizer {tok.name} produced id {int(ids.max())} outside its vocab_size "
            f"{tok.vocab_size}; the tokenizer file is inconsistent"
        )
    return EncodedChunk(u, ids.astype(dtype), lengths, sum(len(d) for d in docs))


def _start_method() -> str:
    """``fork`` on Linux: workers inherit the tokenizer and never re-run the caller's script (a
    spawned worker re-imports ``__main__``, which breaks scripts without a main guard). The
    workers only encode, so no lock another thread held at the fork is ever needed in them."""
    return "fork" if sys.platform == "linux" else "spawn"


@contextlib.contextmanager
def _quiet_tokenizers_fork() -> Iterator[None]:
    """HF tokenizers warns in a forked child when the parent used its thread pool, unless
    ``TOKENIZERS_PARALLELISM`` is set; the workers run one thread each anyway."""
    key = "TOKENIZERS_PARALLELISM"
    before = os.environ.get(key)
    os.environ[key] = "false"
    try:
        yield
    finally:
        if before is None:
            del os.environ[key]
        else:
            os.environ[key] = before


def _init_worker(tok: Tokenizer, parent: int) -> None:
    global _TOKENIZER
    # One thread per worker: the processes are the parallelism (no oversubscription).
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["RAYON_NUM_THREADS"] = "1"
    _TOKENIZER = tok
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()


def _exit_with_parent(parent: int) -> None:
    """A SIGKILLed prepare cannot stop its pool: each worker leaves once its parent is gone."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def _work(args: tuple[list[bytes], int, str]) -> EncodedChunk:
    docs, split_seed, dtype = args
    assert _TOKENIZER is not None
    return encode_chunk(_TOKENIZER, docs, split_seed, np.dtype(dtype))


def encode_chunks(
    chunks: Iterable[tuple[Any, list[bytes]]],
    tok: Tokenizer,
    *,
    split_seed: int,
    dtype: np.dtype,
    workers: int = 1,
    parallel_after: int = 0,
) -> Iterator[tuple[Any, list[bytes], EncodedChunk]]:
    """``(tag, docs, encoded)`` for each ``(tag, docs)`` chunk, in order, on ``workers`` processes.

    ``workers == 1`` encodes in this process. With more, the first ``parallel_after`` bytes of
    text are still encoded in process (a small corpus is done before workers would have
    started) and the pool starts with the chunk after them. Closing the generator early (a token
    budget reached, an error) stops the workers; chunks still in flight are discarded.
    """
    if workers < 1:
        raise UserError(f"workers={workers} must be >= 1")
    it = iter(chunks)
    seen = 0
    for tag, docs in it:
        yield tag, docs, encode_chunk(tok, docs, split_seed, dtype)
        seen += sum(len(d) for d in docs)
        if workers > 1 and seen >= parallel_after:
            break
    else:
        return
    import multiprocessing
    from concurrent.futures import Future, ProcessPoolExecutor

    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context(_start_method()),
        initializer=_init_worker,
        initargs=(tok, os.getpid()),
    )
    pending: deque[tuple[Any, list[bytes], Future[EncodedChunk]]] = deque()
    try:
        exhausted = False
        while True:
            while not exhausted and len(pending) < 2 * workers:
                item = next(it, None)
                if item is None:
                    exhausted = True
                    break
                tag, docs = item
                with _quiet_tokenizers_fork():  # the first submit forks every worker
                    future = pool.submit(_work, (docs, split_seed, dtype.str))
                pending.append((tag, docs, future))
            if not pending:
                return
            tag, docs, future = pending.popleft()
            yield tag, docs, future.result()
    finally:
        for *_, future in pending:
            future.cancel()
        pool.shutdown(wait=True, cancel_futures=True)


def chunk_documents(
    docs: Iterable[tuple[Any, bytes]], chunk_bytes: int = CHUNK_BYTES
) -> Iterator[tuple[Any, list[bytes]]]:
    """Group ``(tag, document)`` pairs into ``(last tag, documents)`` of about ``chunk_bytes``
    of text each (a document is never split)."""
    chunk: list[bytes] = []
    size = 0
    tag: Any = None
    for tag, d in docs:
        chunk.append(d)
        size += len(d)
        if size >= chunk_bytes:
            yield tag, chunk
            chunk, size = [], 0
    if chunk:
        yield tag, chunk
