"""One writer per directory: an exclusive OS lock on ``DIR/.lock``, taken before anything is written.

The lock is ``fcntl.flock(LOCK_EX | LOCK_NB)`` on an open file, so the kernel drops it when the
holder exits for any reason (SIGKILL and power loss included): a lock is never stale and never
needs cleaning up. The file itself stays behind (deleting it would let a later process lock a new
file while another still holds the old one); it holds the holder's pid, host and command, which a
refused process quotes. Locks are re-entrant within one process (a probe experiment that is also
its only method's run directory, ``compare`` training a run inside its own directory), counted per
resolved path. Locks held by a process are not inherited by the programs it starts (Python opens
files non-inheritable) but are shared with a ``fork``ed child, as POSIX defines for ``flock``.

Cost: one open + one ``flock`` system call per directory and command.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from attnlab.base.errors import UserError

LOCK_FILE = ".lock"

_held: dict[Path, tuple[int, int]] = {}  # resolved dir -> (fd, depth)
_guard = threading.Lock()


class DirectoryLockedError(UserError):
    """Another process is writing to the directory (the message names its pid)."""


def _holder(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return "another process"
    first = text.splitlines()[0] if text else ""
    return f"process {first}" if first else "another process"


def acquire(directory: str | os.PathLike, what: str = "run directory") -> None:
    """Create ``directory`` if needed and lock it, or raise :class:`DirectoryLockedError` at once."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no advisory locks, nothing to enforce
        return
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise UserError(f"{directory} is a file; give a directory for the {what}")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        key = directory.resolve()
    except OSError as e:
        raise UserError(
            f"cannot create the {what} {directory} ({e}); choose a writable --out"
        ) from None
    with _guard:
        if key in _held:
            fd, depth = _held[key]
            _held[key] = (fd, depth + 1)
            return
        path = key / LOCK_FILE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise UserError(
                f"cannot lock the {what} {directory} ({e}); choose a writable --out"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DirectoryLockedError(
                f"the {what} {directory} is in use by {_holder(path)}; two processes writing one "
                "directory would mix their files. Wait for it to finish (or stop it), or give "
                "another --out"
            ) from None
        except OSError as e:  # a file system without flock support
            os.close(fd)
            raise UserError(
                f"cannot lock the {what} {directory} ({e}); put it on a local file system"
            ) from None
        os.ftruncate(fd, 0)
        note = f"{os.getpid()} on {socket.gethostname()}: {' '.join(sys.argv)[:500]}\n"
        os.write(fd, note.encode("utf-8", errors="replace"))
        _held[key] = (fd, 1)


def release(directory: str | os.PathLike) -> None:
    """Undo one :func:`acquire` of ``directory``; the last one unlocks it."""
    key = Path(directory).resolve()
    with _guard:
        if key not in _held:
            return
        fd, depth = _held[key]
        if depth > 1:
            _held[key] = (fd, depth - 1)
            return
        del _held[key]
        os.close(fd)  # closing the only descriptor releases the flock


@contextlib.contextmanager
def locked(directory: str | os.PathLike, what: str = "run directory") -> Iterator[Path]:
    """``with locked(run_dir):`` hold the directory's lock for the block."""
    acquire(directory, what)
    try:
        yield Path(directory)
    finally:
        release(directory)
