"""Crash-safe file writes, the one JSON policy, and content hashes.

A reader never sees a half-written file: data goes to a unique temporary sibling, is fsynced, and
is moved into place with ``os.replace`` (atomic on POSIX within one file system); the directory is
fsynced after the rename so the new name survives a power cut.

**JSON policy (every JSON file attnlab writes).** Strict JSON (RFC 8259) only: a non-finite float
(NaN, +inf, -inf) is written as ``null``, never as a bare ``NaN`` token (which most parsers refuse)
nor as a string (which changes the field's type). Where the kind of non-finite value matters, the
writer records it beside the number (a diverged run's ``status.json`` and last metrics row carry
the reason, e.g. ``"loss is nan"``). Readers therefore see ``float | None``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (tuples become lists)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def dumps_json(
    obj: Any, *, indent: int | None = None, default: Callable[[Any], Any] | None = None
) -> str:
    """Strict JSON text of ``obj`` under the policy above (non-finite floats -> null)."""
    return json.dumps(
        json_safe(obj), indent=indent, ensure_ascii=False, allow_nan=False, default=default
    )


def temp_sibling(path: Path, tag: str = "tmp") -> Path:
    """A unique hidden name next to ``path`` (same directory, so a rename is atomic)."""
    return path.with_name(f".{path.name}.{tag}-{uuid.uuid4().hex[:8]}")


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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
        fsync_dir(path.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """:func:`atomic_write_bytes` of ``text`` in UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(
    path: str | os.PathLike,
    obj: Any,
    *,
    indent: int = 2,
    default: Callable[[Any], Any] | None = None,
) -> None:
    """``obj`` as strict JSON (see the module's policy) plus a newline, written atomically."""
    atomic_write_text(path, dumps_json(obj, indent=indent, default=default) + "\n")


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB chunks (cost: one sequential read)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()
