"""attnlab deletes or overwrites only what it wrote: a marker in every directory it creates.

A run, experiment, probe or export directory holds ``.attnlab.json``::

    {"written_by": "attnlab", "kind": "run", "version": "0.x",
     "home": {"path": "/abs/dir", "device": 2049, "inode": 1234},
     "files": {"config.toml": "<sha256>", ...}}

written before anything else goes in. ``home`` binds the marker to the directory it was written
in; ``files`` is the manifest of what attnlab wrote there that a user might edit, with each
file's SHA-256 as attnlab wrote it (:func:`record_files`).

**When a marker is honoured** (:func:`unbound` says why not). A marker makes a directory
attnlab's only where it belongs to that directory, so a marker copied into a user's folder
(``cp RUN/.attnlab.json mine/``) is not honoured:

1. ``home`` names this very directory (same device and inode: it was written here; a rename or
   ``mv`` on one file system keeps it), or
2. every file of the manifest is here with its recorded SHA-256 (the directory was copied or
   moved whole, with what attnlab wrote in it), or
3. the kind's own evidence says attnlab made the directory (the caller's ``legacy`` test, e.g. a
   run's intact checkpoint), or
4. only for a marker of an earlier attnlab (no ``home``): the marker is the oldest entry of the
   directory by inode change time (``ctime``, which copying cannot preserve). attnlab writes it
   first; a marker copied into a folder later is newer than the folder's files.

Honouring a marker writes nothing; attnlab's next write into a moved directory
(:func:`record_files`) binds its marker there.

**Edited files are the user's.** Before replacing or deleting a file it recorded, a writer calls
:func:`keep_if_edited`: a file whose bytes are no longer the recorded ones (or that was never
recorded, and differs from what is about to be written) is renamed aside
(``report.md`` -> ``report.user-edited-20250101-120000.md``) and a one-line
:class:`KeptWarning` says where (an empty file holds nothing to keep). :func:`write_owned` does
both steps around an atomic write and records the new file's SHA-256.

A command that would replace content (``--restart``, ``--force``, a rerun into an existing
``--out``) first asks :func:`claim`: a directory that is new, empty, or carries an honoured
marker of the same kind is attnlab's; any other non-empty directory is the user's, and the
command refuses it, naming the files it holds, without advising a flag that would delete them.
:func:`foreign` names the entries of an owned directory that attnlab did not write.

:func:`overlaps` keeps an output away from its inputs: an ``--out`` may not be, contain or lie
inside a directory that must survive the command (the run being exported, any run directory).

Cost: one ``listdir``, one ``stat`` and one small JSON read per directory and command; hashing
only the recorded files (small text files) when a directory moved or a file is replaced.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from attnlab.base.atomic import atomic_write_json, sha256_file
from attnlab.base.errors import UserError

MARKER = ".attnlab.json"
#: entries any attnlab directory may hold besides its own files (the lock, a write probe)
ALWAYS_OURS = (MARKER, ".lock")
#: name prefixes of what another attnlab process creates for an instant in any directory it
#: writes (the marker's atomic temporary file, an --out write probe): never a user's file
TRANSIENT = (f".{MARKER}.tmp-", ".attnlab-probe-")


def _ours(name: str) -> bool:
    return name in ALWAYS_OURS or name.startswith(TRANSIENT)


class KeptWarning(UserWarning):
    """A file a user edited was kept aside instead of being replaced (the message says where)."""


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
    """The kind the marker of ``directory`` records (``run``, ``experiment``, ...), or None.
    Whether the marker belongs to ``directory`` is :func:`unbound`'s question."""
    marker = read_marker(directory)
    kind = marker.get("kind") if marker else None
    return kind if isinstance(kind, str) else None


def _home(directory: Path, at: Path | None = None) -> dict[str, Any]:
    st = directory.stat()
    return {"path": str((at or directory).resolve()), "device": st.st_dev, "inode": st.st_ino}


def recorded_files(marker: Mapping[str, Any] | None) -> dict[str, str]:
    """The manifest of a marker (relative path -> SHA-256); an earlier attnlab's list of names,
    or a damaged entry, records no hash."""
    files = (marker or {}).get("files")
    if not isinstance(files, dict):
        return {}
    return {k: v for k, v in files.items() if isinstance(k, str) and isinstance(v, str)}


def mark(
    directory: str | os.PathLike,
    kind: str,
    *,
    files: Mapping[str, str] | None = None,
    at: str | os.PathLike | None = None,
) -> None:
    """Write the marker of ``kind`` into ``directory`` (created if needed), bound to it; the
    manifest is ``files``, else the one an earlier marker of the same kind recorded. ``at``: the
    path the directory is about to be renamed to (recorded as its path; the inode stays)."""
    import attnlab

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    old = read_marker(directory)
    if files is None:
        files = recorded_files(old) if old and old.get("kind") == kind else {}
    record = {
        "written_by": "attnlab",
        "kind": kind,
        "version": attnlab.__version__,
        "home": _home(directory, Path(at) if at is not None else None),
        "files": dict(sorted(files.items())),
    }
    atomic_write_json(directory / MARKER, record, indent=1)


def file_hashes(directory: str | os.PathLike, names: Iterable[str]) -> dict[str, str]:
    """relative path -> SHA-256 of each of ``names`` that is a regular file in ``directory``."""
    directory = Path(directory)
    out = {}
    for name in names:
        p = directory / name
        if p.is_file() and not p.is_symlink():
            out[name] = sha256_file(p)
    return out


def record_files(directory: str | os.PathLike, *names: str) -> None:
    """Add the SHA-256 of ``names`` (as they are now: just written by attnlab) to the manifest
    of ``directory``'s marker; a name that is no file is dropped from it. No marker: nothing."""
    directory = Path(directory)
    marker = read_marker(directory)
    if marker is None or not isinstance(marker.get("kind"), str):
        return
    files = recorded_files(marker)
    for name in names:
        files.pop(name, None)
    files.update(file_hashes(directory, names))
    mark(directory, marker["kind"], files=files)


def _oldest_entry(directory: Path) -> bool:
    """The marker's inode changed no later than any other entry's (it was written first)."""
    try:
        own = (directory / MARKER).lstat().st_ctime_ns
        return all(
            (directory / n).lstat().st_ctime_ns >= own
            for n in os.listdir(directory)
            if not _ours(n)
        )
    except OSError:
        return False


def _bound_here(directory: Path, marker: Mapping[str, Any]) -> bool:
    home = marker.get("home")
    if not isinstance(home, dict):
        return False
    try:
        st = directory.stat()
    except OSError:
        return False
    return (home.get("device"), home.get("inode")) == (st.st_dev, st.st_ino)


def unbound(
    directory: str | os.PathLike,
    marker: Mapping[str, Any],
    legacy: Callable[[Path], bool] | None = None,
) -> str | None:
    """Why ``marker`` does not make ``directory`` attnlab's (see the module doc), or None when it
    is honoured."""
    directory = Path(directory)
    home = marker.get("home")
    if _bound_here(directory, marker):
        return None
    files = recorded_files(marker)
    if files and file_hashes(directory, files) == files:
        return None
    if legacy is not None and legacy(directory):
        return None
    if not isinstance(home, dict):
        if _oldest_entry(directory):
            return None
        return "was put there after the files it holds (a copied marker)"
    return f"was written for {home.get('path')!s}, and what attnlab wrote there is not here"


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

    Passes (and marks, bound to the directory) a directory that does not exist or holds nothing
    but a lock file (and a stray marker); passes, writing nothing, one that carries an honoured
    marker of ``kind`` (:func:`unbound`); ``legacy`` may accept an unmarked directory an earlier
    attnlab wrote (it is then marked). Anything else raises a :class:`UserError` naming what it
    holds.
    """
    directory = Path(directory)
    marker = read_marker(directory)
    marker_kind = kind_of(directory)
    entries = [n for n in _entries(directory) if not _ours(n)]
    if marker is not None and marker_kind == kind:
        why = unbound(directory, marker, legacy)
        if why is None:  # rebound where it moved by attnlab's next write (record_files)
            return
        if not entries:  # a stray marker in an empty folder: nothing to lose
            mark(directory, kind, files={})
            return
        raise UserError(
            f"{flag} {directory} holds an attnlab marker ({MARKER}) that {why}, so it is not "
            f"attnlab's {what}: it holds {shown(entries)}. attnlab never writes into or deletes "
            f"a folder it did not create; give another {flag} (a new or empty directory)"
        )
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


def _aside_name(path: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    stem, suffix = (path.stem, path.suffix) if path.suffix else (path.name, "")
    candidate = path.with_name(f"{stem}.user-edited-{stamp}{suffix}")
    i = 2
    while candidate.exists() or candidate.is_symlink():
        candidate = path.with_name(f"{stem}.user-edited-{stamp}-{i}{suffix}")
        i += 1
    return candidate


def edited(directory: str | os.PathLike, name: str, known: Iterable[bytes] = ()) -> bool:
    """Whether ``directory/name`` is not what attnlab wrote: its SHA-256 differs from the one the
    marker records. A file never recorded (an earlier attnlab's, or the user's) is attnlab's only
    when its bytes are one of ``known`` (e.g. the bytes about to be written). A link or anything
    but a regular file is never attnlab's."""
    import hashlib

    path = Path(directory) / name
    if not path.exists() and not path.is_symlink():
        return False
    if path.is_symlink() or not path.is_file():
        return True
    now = sha256_file(path)
    recorded = recorded_files(read_marker(directory)).get(name)
    if recorded is not None:
        return now != recorded
    return now not in {hashlib.sha256(b).hexdigest() for b in known}


def keep_if_edited(
    directory: str | os.PathLike, name: str, known: Iterable[bytes] = ()
) -> Path | None:
    """Before attnlab replaces or deletes ``directory/name``: when it is :func:`edited`, rename
    it aside (``NAME.user-edited-TIMESTAMP.EXT``), warn in one line where it went, and return the
    new path; None when the file is attnlab's (or absent) and may be replaced."""
    directory = Path(directory)
    path = directory / name
    if not edited(directory, name, known):
        return None
    if path.is_file() and not path.is_symlink() and path.stat().st_size == 0:
        return None  # an empty file holds nothing to keep
    aside = _aside_name(path)
    os.rename(path, aside)
    warnings.warn(
        f"{path} is not the file attnlab wrote there (edited since, or not attnlab's): kept as "
        f"{aside.name}",
        KeptWarning,
        stacklevel=2,
    )
    return aside


def write_owned(
    directory: str | os.PathLike, name: str, data: bytes, known: Iterable[bytes] = ()
) -> Path:
    """Replace ``directory/name`` with ``data`` atomically, keeping an edited file aside first
    (:func:`keep_if_edited`; ``known``: other bytes attnlab may have written there), and record
    the new file's SHA-256 in the marker's manifest (:func:`record_files`)."""
    from attnlab.base.atomic import atomic_write_bytes

    directory = Path(directory)
    keep_if_edited(directory, name, [data, *known])
    atomic_write_bytes(directory / name, data)
    record_files(directory, name)
    return directory / name


def foreign(directory: str | os.PathLike, ours: Callable[[str], bool]) -> list[str]:
    """The entries of ``directory`` that ``ours`` (a name test) does not claim, sorted."""
    return [n for n in _entries(Path(directory)) if not _ours(n) and not ours(n)]


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
