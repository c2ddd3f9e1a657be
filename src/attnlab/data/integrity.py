"""A prepared data directory checked against its ``meta.json``, cheaply, before every training.

``prepare`` records the size and sha256 of every file a reader depends on: the token shards
(``meta["splits"]``), the tokenizer's files (``meta["files"]``) and ``meta.json`` itself
(``meta["sha256"]``: the sha256 of its canonical JSON without that key, as checkpoints seal their
``state.json``). :func:`verify_data` compares the directory with those records:

* sizes always (one ``stat`` per file);
* the full sha256 of a file on first use and after any change of its stamp (size, mtime, ctime,
  inode: ctime cannot be set back by a user), cached in ``DIR/.verified.json``; ``full=True``
  (``attnlab data info --verify``) hashes every file regardless of the cache;
* the vocabulary: the tokenizer's size must equal ``meta["vocab_size"]`` (:func:`check_vocab`).

The ids of each batch are checked against the vocabulary as they are read (:func:`check_ids`:
one ``max()`` per batch), so a shard edited behind the cache's back still cannot index out of
the embedding. Cost of a first check: one sequential read of the directory (sha256 at about
1 GB/s per core); later checks: a ``stat`` per file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.base.atomic import atomic_write_json, sha256_file
from attnlab.base.errors import UserError
from attnlab.data.shards import SPLITS, shard_path

CACHE = ".verified.json"
META = "meta.json"


class DataIntegrityError(UserError):
    """A data directory's file differs from what ``meta.json`` records."""


def seal(meta: dict[str, Any]) -> str:
    """sha256 of ``meta`` without its ``sha256`` key, as canonical JSON (sorted keys)."""
    body = {k: v for k, v in meta.items() if k != "sha256"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def tokenizer_files(directory: Path, spec: dict[str, Any]) -> list[str]:
    """The files (relative to ``directory``) the tokenizer ``spec`` loads from."""
    kind = spec.get("kind")
    names: list[str] = []
    if kind == "gpt2":
        names = [spec["encoder"], spec["vocab"]]
    elif kind == "hf-json":
        names = [spec["file"]]
    elif kind == "hf-auto":
        root = directory / spec["dir"]
        names = [str(p.relative_to(directory)) for p in sorted(root.rglob("*")) if p.is_file()]
    return [n for n in names if (directory / n).is_file()]


def record_files(directory: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` with the tokenizer files' sizes and sha256 and its own seal (``prepare``)."""
    files = {
        name: {"bytes": (directory / name).stat().st_size, "sha256": sha256_file(directory / name)}
        for name in tokenizer_files(directory, meta.get("tokenizer") or {})
    }
    meta = {**meta, "files": files}
    meta["sha256"] = seal(meta)
    return meta


def _expected(meta: dict[str, Any]) -> dict[str, dict[str, Any]]:
    itemsize = np.dtype(meta["dtype"]).itemsize
    out = {
        shard_path(Path(), split).name: {
            "bytes": int(meta["splits"][split]["tokens"]) * itemsize,
            "sha256": meta["splits"][split]["sha256"],
        }
        for split in SPLITS
    }
    files = meta.get("files")
    if isinstance(files, dict):
        out.update({str(k): v for k, v in files.items() if isinstance(v, dict)})
    return out


def _stamp(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _read_cache(directory: Path) -> dict[str, Any]:
    try:
        data = json.loads((directory / CACHE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _refuse(path: Path, what: str) -> DataIntegrityError:
    return DataIntegrityError(
        f"{path} {what}; the data directory changed after `attnlab data prepare`, so a run on "
        "it would not train on the data its meta.json describes. Prepare it again (attnlab "
        "data prepare ... --force) or restore the file"
    )


def verify_data(directory: str | Path, meta: dict[str, Any], *, full: bool = False) -> list[str]:
    """Check ``directory`` against ``meta`` (see the module doc); the names checked. Raises
    :class:`DataIntegrityError` naming the first file that differs."""
    directory = Path(directory)
    recorded = meta.get("sha256")
    if isinstance(recorded, str) and seal(meta) != recorded:
        raise _refuse(
            directory / META, "was edited: its content does not match the sha256 it recorded"
        )
    cache = {} if full else _read_cache(directory)
    fresh: dict[str, Any] = {}
    checked = []
    for name, rec in _expected(meta).items():
        path = directory / name
        if path.is_symlink() and not path.exists():
            raise _refuse(path, "is a dangling link")
        try:
            st = path.stat()
        except OSError:
            raise _refuse(path, "is missing") from None
        if st.st_size != int(rec.get("bytes", -1)):
            raise _refuse(path, f"has {st.st_size} bytes, meta.json records {rec.get('bytes')}")
        entry = {"stamp": _stamp(st), "sha256": rec.get("sha256")}
        if cache.get(name) != entry and sha256_file(path) != rec.get("sha256"):
            raise _refuse(path, "does not match the sha256 meta.json records")
        fresh[name] = entry
        checked.append(name)
    if fresh != cache:
        with contextlib.suppress(OSError):  # a read-only data directory: check again next time
            atomic_write_json(directory / CACHE, fresh, indent=1)
    return [*checked, *([META] if isinstance(recorded, str) else [])]


def check_vocab(directory: str | Path, meta: dict[str, Any], tokenizer_vocab: int) -> None:
    """Refuse a ``meta.json`` whose ``vocab_size`` is not its tokenizer's."""
    if int(meta["vocab_size"]) != int(tokenizer_vocab):
        raise DataIntegrityError(
            f"{Path(directory) / META} says vocab_size {meta['vocab_size']}, but its tokenizer "
            f"has {tokenizer_vocab} tokens; one of them was changed after prepare. Prepare the "
            "data again (attnlab data prepare ... --force)"
        )


def check_ids(ids: np.ndarray, vocab: int, where: str) -> None:
    """Refuse token ids outside ``0 .. vocab - 1`` (one ``max()``; the ids are unsigned)."""
    if ids.size and int(ids.max()) >= vocab:
        raise DataIntegrityError(
            f"{where} holds token id {int(ids.max())}, outside the tokenizer's {vocab} ids; the "
            "file is damaged or was written for another tokenizer. Prepare the data again "
            "(attnlab data prepare ... --force)"
        )
