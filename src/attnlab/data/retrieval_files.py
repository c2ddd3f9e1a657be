"""Reading a retrieval database's files with their damage named, and what its neighbours lack.

A database directory is ``DATA/retrieval/m{m}-k{k}-c{c}/`` (``attnlab.data.retrieval``). Every
damaged file (``meta.json`` not a JSON object or missing a setting, a truncated or foreign
``.npy``, an index of the wrong shape) is a ``UserError`` naming the file and the one command
that rebuilds it, which :func:`rebuild_command` spells out from the directory's own name (the
settings are in it), so the advice holds in whichever command opened the database (``train``,
``eval``, ``generate``: their own ``--restart`` means something else).

:func:`shortfall` counts the query chunks with fewer than k neighbours, and says why: RETRO's
no-leakage rule removes from a training chunk's candidates every database chunk that shares a
document with it, so a training split of few (long) documents leaves training chunks with few
or no neighbours. Cost: one pass over the index (O(chunks x k)) and, for the reason, one over
the training tokens (document ids) and a binary search per chunk.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.base.errors import UserError
from attnlab.data.versioned import read_versioned_meta

_NAME = re.compile(r"m(\d+)-k(\d+)-c(\d+)")
#: the settings ``meta.json`` must hold, with their types
SETTINGS = {"chunk_size": int, "neighbours": int, "continuation": int, "files": dict}


def rebuild_command(directory: Path) -> str:
    """The ``attnlab data retrieval`` command that rebuilds the database in ``directory``."""
    data = shlex.quote(str(directory.parent.parent))
    found = _NAME.fullmatch(directory.name)
    if found is None:
        return f"attnlab data retrieval --data {data} --chunk-size M --neighbours K --restart"
    m, k, c = found.groups()
    return (
        f"attnlab data retrieval --data {data} --chunk-size {m} --neighbours {k} "
        f"--continuation {c} --restart"
    )


def damaged(path: Path, what: str) -> UserError:
    """The error for a damaged file of the database in ``path.parent``."""
    return UserError(f"{path} {what}; rebuild the database with `{rebuild_command(path.parent)}`")


def read_meta(path: Path, fmt: str, version: int) -> dict[str, Any]:
    """``meta.json`` of a database, checked to be a JSON object of this format with its settings."""
    meta = read_versioned_meta(
        path, fmt, version, "retrieval database", lambda problem: damaged(path, problem)
    )
    for key, kind in SETTINGS.items():
        value = meta.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise damaged(path, f"has no valid {key!r} (it holds {value!r})")
    return meta


def load_index(path: Path, meta: dict[str, Any], split: str) -> np.ndarray:
    """``train.npy`` or ``val.npy``: int64 [query chunks, k], memory-mapped."""
    if not path.is_file():
        state = "is missing" if not path.exists() else "is not a file"
        raise damaged(path, state)
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:  # truncated, not .npy, a pickle
        raise damaged(path, f"cannot be read as a NumPy array ({e})") from None
    rows = meta.get("query_chunks")
    rows = rows.get(split) if isinstance(rows, dict) else None
    want = (rows if isinstance(rows, int) else arr.shape[0], meta["neighbours"])
    if arr.dtype != np.int64 or arr.ndim != 2 or tuple(arr.shape) != tuple(want):
        raise damaged(
            path, f"holds {arr.dtype} {list(arr.shape)}, not int64 {list(want)} as meta.json says"
        )
    return arr


def document_ids(tokens: np.ndarray, eos_id: int) -> np.ndarray:
    """Document number of every token (documents end with eos; the eos belongs to its document)."""
    ends = np.asarray(tokens) == eos_id
    return np.concatenate([[0], np.cumsum(ends)[:-1]]).astype(np.int64)


def _documents_shared(train: np.ndarray, eos_id: int, m: int, cont: int) -> tuple[np.ndarray, int]:
    """For each training chunk, how many database chunks share a document with it (the chunks
    RETRO's rule excludes); and the number of documents in the split."""
    docs = document_ids(train, eos_id)
    n = len(train) // m
    starts = np.arange(n) * m
    q_lo, q_hi = docs[starts], docs[starts + m - 1]
    db_lo, db_hi = docs[starts], docs[np.minimum(starts + m + cont, len(train)) - 1]
    # db_lo, db_hi are sorted: the clashing chunks j (db_hi[j] >= q_lo, db_lo[j] <= q_hi) are a run
    first = np.searchsorted(db_hi, q_lo, side="left")
    last = np.searchsorted(db_lo, q_hi, side="right")
    return np.maximum(last - first, 0), int(docs[-1]) + 1 if len(docs) else 0


def shortfall(db: Any, train_tokens: np.ndarray, eos_id: int) -> str | None:
    """A warning when query chunks have fewer than k neighbours (-1 in the index), with the
    reason; None when every chunk has all k."""
    k, m = int(db.meta["neighbours"]), db.chunk_size
    short = {s: db.short(s) for s in ("train", "val")}
    if not any(short.values()):
        return None
    none = {s: int((np.asarray(db.split(s)) < 0).all(axis=1).sum()) for s in ("train", "val")}
    parts = [
        f"{short[s]:,} of {len(db.split(s)):,} {s} chunks have fewer than k={k} neighbours "
        f"({none[s]:,} have none)"
        for s in ("train", "val")
        if short[s]
    ]
    text = "; ".join(parts)
    if short["train"]:
        shared, n_docs = _documents_shared(train_tokens, eos_id, m, db.neighbour_len - m)
        n_db = int(db.meta.get("database_chunks", len(train_tokens) // m))
        text += (
            f". RETRO's no-leakage rule excludes from a training chunk's candidates every "
            f"database chunk that shares a document with it: the training split holds "
            f"{n_docs:,} document{'s' if n_docs != 1 else ''}, so the rule excluded, per training "
            f"chunk, {shared.mean():,.0f} of the {n_db:,} database chunks on average "
            f"({shared.max():,} at most). The missing neighbours are empty (padding) in "
            "training; prepare the data from more, shorter documents (one per line of a .jsonl) "
            "for real neighbours"
        )
    return text
