"""Crash-safe file writes and content hashes.

A reader never sees a half-written file: data goes to a temporary sibling first and is
moved into place with ``os.replace`` (atomic on POSIX within one file system).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20


def temp_sibling(path: Path, tag: str = "tmp") -> Path:
    """A unique hidden name next to ``path`` (same directory, so a rename is atomic)."""
    return path.with_name(f".{path.name}.{tag}-{uuid.uuid4().hex[:8]}")


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    """``json.dump`` with indentation, written atomically."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode())


@contextlib.contextmanager
def atomic_directory(final: Path, *, replace: bool) -> Iterator[Path]:
    """Yield a temporary directory that becomes ``final`` only if the block succeeds.

    With ``replace``, an existing ``final`` is swapped out (renamed, then deleted) after the new
    directory is complete, so a failure at any point leaves the old directory untouched.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(final)
    tmp.mkdir()
    try:
        yield tmp
        if final.exists():
            if not replace:
                raise FileExistsError(final)
            old = temp_sibling(final, "old")
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()
