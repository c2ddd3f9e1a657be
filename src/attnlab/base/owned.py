"""attnlab deletes or overwrites only what it wrote: a marker in every directory it creates.

A run, experiment, probe or export directory holds ``.attnlab.json``::

    {"written_by": "attnlab", "kind": "run", "version": "0.x"}

written before anything else goes in. A command that would replace content (``--restart``,
``--force``, a rerun into an existing ``--out``) first asks :func:`claim`: a directory that is new,
empty, or carries the marker of the same kind is attnlab's; any other non-empty directory is the
user's, and the command refuses it, naming the files it holds, without advising a flag that would
delete them. :func:`foreign` names the entries of an owned directory that attnlab did not write
(a user's ``report.md`` in an experiment directory), so a writer refuses to replace them.

:func:`overlaps` keeps an output away from its inputs: an ``--out`` may not be, contain or lie
inside a directory that must survive the command (the run being exported, any run directory).

Cost: one ``listdir`` and one small JSON read per directory and command.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from attnlab.base.atomic import atomic_write_json
from attnlab.base.errors import UserError

MARKER = ".attnlab.json"
#: entries any attnlab directory may hold besides its own files (the lock, a write probe)
ALWAYS_OURS = (MARKER, ".lock")


def read_marker(directory: str | os.PathLike) -> dict[str, Any] | None:
    """The marker of ``directory``, or None when it has none (or a damaged one)."""
    path = Path(directory) / MARKER
    try:
        if not path.is_file() or path.is_symlink():
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("written_by") != "attnlab":
        return None
    return data


def kind_of(directory: str | os.PathLike) -> str | None:
    """The kind the marker of ``directory`` records (``run``, ``experiment``, ...), or None."""
    marker = read_marker(directory)
    kind = marker.get("kind") if marker else None
    return kind if isinstance(kind, str) else None


def mark(directory: str | os.PathLike, kind: str, **extra: Any) -> None:
    """Write the marker of ``kind`` into ``directory`` (created if needed)."""
    import attnlab

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    record = {"written_by": "attnlab", "kind": kind, "version": attnlab.__version__, **extra}
    atomic_write_json(directory / MARKER, record, indent=1)


def _entries(directory: Path) -> list[str]:
    try:
        return sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    except OSError as e:
        raise UserError(
            f"cannot list {directory} ({e.strerror or e}); check its permissions"
        ) from None


def shown(names: Iterable[str], limit: int = 8) -> str:
    """``a, b, c and 4 more``: a short list of names for a message."""
    names = list(names)
    head = ", ".join(names[:limit])
    return head + (f" and {len(names) - limit} more" if len(names) > limit else "")


def claim(
    directory: str | os.PathLike,
    kind: str,
    *,
    what: str,
    flag: str = "--out",
    legacy: Callable[[Path], bool] | None = None,
) -> None:
    """Make ``directory`` attnlab's ``kind`` directory or refuse it.

    Passes (and marks) a directory that does not exist, holds nothing but a lock file, or already
    carries the marker of ``kind``; ``legacy`` may accept an unmarked directory an earlier attnlab
    wrote (it is then marked). Anything else raises a :class:`UserError` naming what it holds.
    """
    directory = Path(directory)
    marker_kind = kind_of(directory)
    if marker_kind == kind:
        return
    entries = [n for n in _entries(directory) if n not in ALWAYS_OURS]
    if marker_kind is not None:
        raise UserError(
            f"{flag} {directory} is an attnlab {marker_kind} directory, not a {what}; give "
            f"another {flag} (a new or empty directory)"
        )
    if entries and not (legacy is not None and legacy(directory)):
        raise UserError(
            f"{flag} {directory} is not empty and was not written by attnlab as a {what}: it "
            f"holds {shown(entries)}. attnlab never writes into or deletes a folder it did not "
            f"create; give another {flag} (a new or empty directory)"
        )
    mark(directory, kind)


def foreign(directory: str | os.PathLike, ours: Callable[[str], bool]) -> list[str]:
    """The entries of ``directory`` that ``ours`` (a name test) does not claim, sorted."""
    return [n for n in _entries(Path(directory)) if n not in ALWAYS_OURS and not ours(n)]


def _resolved(path: str | os.PathLike) -> Path:
    return Path(os.path.abspath(Path(path).expanduser())).resolve()


def overlaps(out: str | os.PathLike, keep: str | os.PathLike) -> str | None:
    """How ``out`` overlaps ``keep`` (``"is"``, ``"contains"``, ``"lies inside"``), or None."""
    a, b = _resolved(out), _resolved(keep)
    if a == b:
        return "is"
    if a in b.parents:
        return "contains"
    if b in a.parents:
        return "lies inside"
    return None


def enclosing_owned(path: str | os.PathLike, kinds: Iterable[str]) -> Path | None:
    """The nearest directory at or above ``path`` whose marker is one of ``kinds``."""
    wanted = set(kinds)
    p = _resolved(path)
    for d in [p, *p.parents]:
        if kind_of(d) in wanted:
            return d
    return None
