"""A chunk and its neighbours as text, with their documents: for a user to look at what a
retrieval model reads (``attnlab data retrieval --show RUN_OR_DATA --index N``).

Each text is decoded by the data's own tokenizer; a neighbour is its chunk plus its
continuation, shown apart. Documents are numbered from 0 in their split's token stream. The
reading tokens of chunk c (chunk c's last token and chunk c+1, :mod:`.leakage`) are shown with
their documents, so a user can check the leakage rule by eye: for a training chunk, no
neighbour's document is among them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from attnlab.base.errors import UserError
from attnlab.data.retrieval import Database
from attnlab.data.retrieval_index.leakage import document_ids
from attnlab.data.tokendata import TokenData


def _text(data: TokenData, ids: np.ndarray) -> str:
    return json.dumps(data.tokenizer.decode([int(t) for t in ids]), ensure_ascii=False)


def _docs(docs: np.ndarray, lo: int, hi: int) -> str:
    a, b = int(docs[lo]), int(docs[hi - 1])
    return f"document {a:,}" if a == b else f"documents {a:,}-{b:,}"


def show_chunk(db: Database, data: TokenData, split: str, index: int) -> list[str]:
    """The lines that show chunk ``index`` of ``split`` and its neighbours."""
    if split not in ("train", "val"):
        raise UserError(f"--split {split!r}: use train or val")
    rows = db.split(split)
    if not 0 <= index < len(rows):
        raise UserError(f"--index {index}: the {split} split has chunks 0..{len(rows) - 1:,}")
    m, r = db.chunk_size, db.neighbour_len
    toks, train = np.asarray(data.split(split)), np.asarray(data.train)
    q_docs, t_docs = document_ids(toks, data.eos_id), document_ids(train, data.eos_id)
    lo, hi = index * m, (index + 1) * m
    read_hi = min(hi + m, len(toks))
    lines = [
        f"database  {db.directory}",
        f"  index    {db.meta.get('embedder')}; leakage rule: {db.leakage}",
        f"{split} chunk {index:,} of {len(rows):,}: tokens {lo:,}-{hi - 1:,}, "
        f"{_docs(q_docs, lo, hi)}",
        f"  text     {_text(data, toks[lo:hi])}",
        f"  read by  tokens {hi - 1:,}-{read_hi - 1:,} (its last token, the next chunk), "
        f"{_docs(q_docs, hi - 1, read_hi)}",
    ]
    for i, j in enumerate(np.asarray(rows[index]).tolist(), 1):
        if j < 0:
            lines.append(f"neighbour {i}: none (fewer chunks qualified; padding)")
            continue
        a, c, b = j * m, min(j * m + m, len(train)), min(j * m + r, len(train))
        lines += [
            f"neighbour {i}: database chunk {j:,}, train tokens {a:,}-{b - 1:,}, "
            f"{_docs(t_docs, a, b)}",
            f"  chunk    {_text(data, train[a:c])}",
            f"  then     {_text(data, train[c:b])}",
        ]
    return lines


def resolve_database(target: str | Path) -> Path:
    """The database directory of a run (its ``status.json``), a database directory, or the
    one database of a prepared data directory."""
    path = Path(target)
    status = path / "status.json"
    if status.is_file():
        try:
            rec = json.loads(status.read_text()).get("retrieval_database") or {}
        except (ValueError, AttributeError):
            rec = {}
        if not rec.get("directory"):
            raise UserError(f"{path} is a run without a retrieval database (not a retrieval run)")
        return Path(rec["directory"])
    if (path / "meta.json").is_file() and (path / "train.npy").exists():
        return path
    found = sorted(p.parent for p in (path / "retrieval").glob("*/meta.json"))
    if len(found) == 1:
        return found[0]
    if not found:
        raise UserError(
            f"{path} is neither a retrieval run, a database, nor a data directory with a "
            "database; build one with `attnlab data retrieval --data DIR`"
        )
    names = ", ".join(p.name for p in found)
    raise UserError(
        f"{path} holds several databases ({names}); give one: --show {path}/retrieval/NAME"
    )
