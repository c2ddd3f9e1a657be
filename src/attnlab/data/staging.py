"""Where a ``prepare`` builds its output: a resumable, locked staging directory beside ``--out``.

``data/NAME`` is built in ``data/.NAME.partial/`` and renamed into place only when complete, so a
reader never sees a half-written data directory. ``progress.json`` in the staging directory
(written atomically, after the shard bytes it describes are flushed and fsynced) records how far
the encoding got; a prepare killed at any point resumes from the last record when run again
with the same arguments (``key``), and starts over when they differ.

An exclusive OS lock on ``data/.NAME.lock`` (``fcntl.flock``, released when its process dies, so a
SIGKILL never leaves a stale lock) keeps two prepares off one output: the second fails at once
naming the holder's pid. While it holds the lock, a prepare also deletes what killed runs of
earlier attnlab versions left beside the output (``.NAME.tmp-*``, ``.NAME.old-*``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from attnlab.base.atomic import atomic_write_json, temp_sibling
from attnlab.base.errors import UserError

PROGRESS = "progress.json"
_HELD: set[int] = set()  # lock file descriptors this process holds


def _close_held_in_child() -> None:
    # A forked encoding worker inherits the lock's descriptor; closing its copy keeps the lock
    # with the parent alone, so it is released the moment the parent dies, not when they do.
    for fd in _HELD:
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_held_in_child)


def staging_dir(out: Path) -> Path:
    return out.with_name(f".{out.name}.partial")


def lock_path(out: Path) -> Path:
    return out.with_name(f".{out.name}.lock")


@contextlib.contextmanager
def output_lock(
    out: Path, wait: bool = False, fix: str = "choose a writable --out"
) -> Iterator[None]:
    """Hold the exclusive lock of ``out`` (see the module docstring); if another process has it,
    a UserError, or with ``wait`` block until it is released. ``fix`` ends the error when the
    lock cannot be created (it names the running command's way to choose another place)."""
    import fcntl

    path = lock_path(out)
    while True:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise UserError(f"cannot write in {path.parent} ({e.strerror or e}); {fix}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise UserError(
                f"another attnlab data prepare (pid {holder}) is writing {out}; wait for it to "
                "finish, or stop it (a stopped prepare resumes when run again)"
            ) from None
        # The holder before us may have unlinked the file after we opened it: lock the live one.
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    _HELD.add(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        _HELD.discard(fd)
        os.close(fd)  # releases the lock


def remove_stale(out: Path) -> list[Path]:
    """Delete the leftovers of killed prepares beside ``out`` (call with the lock held)."""
    removed = []
    for pattern in (f".{out.name}.tmp-*", f".{out.name}.old-*"):
        for path in out.parent.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(path)
    return removed


class Stage:
    """The staging directory of one output, with its progress record."""

    def __init__(self, out: Path, key: dict[str, Any]) -> None:
        self.out = out
        self.dir = staging_dir(out)
        self.key = key
        self.progress: dict[str, Any] | None = None

    def open(self, restart: bool = False) -> dict[str, Any] | None:
        """Load the progress of an earlier run with the same key, else start an empty stage."""
        record = None
        path = self.dir / PROGRESS
        if not restart and path.is_file():
            with contextlib.suppress(json.JSONDecodeError, UnicodeDecodeError, OSError):
                record = json.loads(path.read_text())
        if isinstance(record, dict) and record.get("key") == self.key:
            self.progress = record
            return record
        if self.dir.exists():
            shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True)
        return None

    def discard(self) -> None:
        """Delete the stage and its progress."""
        shutil.rmtree(self.dir, ignore_errors=True)
        self.progress = None

    def commit(self, progress: dict[str, Any], files: list[Any]) -> None:
        """Record ``progress`` once the bytes of ``files`` (open binary files) are on disk."""
        for f in files:
            f.flush()
            os.fsync(f.fileno())
        self.progress = {**progress, "key": self.key}
        atomic_write_json(self.dir / PROGRESS, self.progress)

    def publish(self, replace: bool) -> None:
        """Rename the finished stage to ``out`` (an existing ``out`` only with ``replace``)."""
        (self.dir / PROGRESS).unlink(missing_ok=True)
        if self.out.exists():
            if not replace:
                raise UserError(f"{self.out} appeared while preparing; pass --force to replace it")
            old = temp_sibling(self.out, "old")
            os.replace(self.out, old)
            os.replace(self.dir, self.out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(self.dir, self.out)
