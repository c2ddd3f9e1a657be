"""The one reader of a versioned ``meta.json`` (a prepared data directory's, a retrieval
database's): a JSON object whose ``format`` and ``version`` are the ones this attnlab writes."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attnlab.base.errors import UserError

_KINDS: dict[type, str] = {str: "string", list: "list", int: "number", float: "number"}
_KINDS.update({bool: "boolean", type(None): "null"})


def read_versioned_meta(
    path: Path, fmt: str, version: int, noun: str, refuse: Callable[[str], UserError]
) -> dict[str, Any]:
    """``path``'s JSON object when its ``format`` is ``fmt`` and its ``version`` ``version``;
    otherwise ``refuse(problem)`` is raised, ``problem`` saying what is wrong with the file
    (``"is not valid JSON (...)"``) and ``refuse`` adding the fix."""
    try:
        meta = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise refuse(f"is not valid JSON ({e})") from None
    except IsADirectoryError:
        raise refuse("is a directory, not a file") from None
    if not isinstance(meta, dict):
        raise refuse(f"holds a JSON {_KINDS.get(type(meta), 'value')}, not an object")
    if meta.get("format") != fmt or meta.get("version") != version:
        raise refuse(
            f"is not an attnlab {noun} v{version} (format={meta.get('format')!r}, "
            f"version={meta.get('version')!r})"
        )
    return meta
