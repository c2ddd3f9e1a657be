"""Reading task items: local JSONL files, or hub datasets while online.

Hub loading stays real code (``datasets.load_dataset``) but fails with a clear message when the
machine is offline, naming the local-file form of the same task.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from attnlab.base.errors import UserError
from attnlab.base.jsonlines import json_lines
from attnlab.base.pathkind import not_a_file


def read_jsonl(path: str | Path, required: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Rows of a JSON-lines file (blank lines skipped), each checked for ``required`` keys."""
    rows = []
    for n, row in read_jsonl_lines(path):
        missing = [k for k in required if k not in row]
        if missing:
            raise UserError(
                f"{path}:{n}: missing field(s) {', '.join(missing)}; this format needs "
                f"{', '.join(required)}"
            )
        rows.append(row)
    return rows


def read_jsonl_lines(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` of every non-blank line of a JSON-lines file; a file that is
    missing, not a file, empty, not UTF-8, or has a line that is not one JSON object is a
    :class:`UserError` naming the file and the line."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"task file {str(p)!r} {not_a_file(p)}; give a JSON-lines (.jsonl) file")

    def decode(raw: bytes, n: int, offset: int) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise UserError(
                f"{p}:{n}: not UTF-8 text (byte 0x{raw[e.start]:02x}); a task file is JSON "
                "lines in UTF-8"
            ) from None

    rows = []
    with p.open("rb") as f:
        for n, row in json_lines(f, p, decode):
            if not isinstance(row, dict):
                raise UserError(f"{p}:{n}: expected a JSON object, got {type(row).__name__}")
            rows.append((n, row))
    if not rows:
        raise UserError(
            f"task file {str(p)!r} has no items (it is empty or blank); one JSON object per line"
        )
    return rows


def write_jsonl(rows: list[dict[str, Any]], path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return p


def _offline() -> str | None:
    """Why the hub cannot be reached, or None: an offline flag is set, or the hub's host name
    does not resolve (checked by DNS only, so an offline machine fails at once instead of after
    the datasets library's retries)."""
    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").lower() in ("1", "true", "yes"):
            return f"{var} is set"
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or ""
    try:
        socket.getaddrinfo(host, 443)
    except OSError:
        return f"{host} cannot be resolved: this machine is offline"
    return None


def load_hub_rows(
    path: str, name: str | None, split: str, *, task: str, local_form: str
) -> Iterator[dict[str, Any]]:
    """Rows of a hub dataset split; offline (or unreachable) -> a :class:`UserError` that tells
    the user to use ``local_form`` (e.g. ``cloze:FILE.jsonl``) with a local file instead."""
    hint = (
        f"task {task!r} reads the hub dataset {path}"
        + (f" ({name})" if name else "")
        + f", which needs the internet. Offline, use {local_form} with a local JSONL file"
    )
    reason = _offline()
    if reason:
        raise UserError(f"{hint} ({reason})")
    from attnlab.base.extras import require

    require("eval", "datasets", what=f"task {task!r} from the hub")
    import datasets

    try:
        ds = datasets.load_dataset(path, name, split=split)
    except Exception as e:  # connection errors come in many types across datasets versions
        raise UserError(f"{hint} ({type(e).__name__}: {str(e)[:200]})") from None
    yield from ds
