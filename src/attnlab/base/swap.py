"""Replace a directory whole, so that a kill at any moment leaves the old or the new one in place.

The new directory is written completely under a hidden sibling name
(:func:`staging_dir`: ``.NAME.attnlab-new-PID``), then put in place by :func:`replace_dir`:

- on Linux, ``renameat2(RENAME_EXCHANGE)`` swaps the two names in one atomic step: ``NAME`` is the
  new directory and the hidden name holds the old one, which is then deleted. At every moment
  ``NAME`` is a complete directory, the old one or the new one;
- where the file system cannot exchange names, the old directory is renamed aside
  (``.NAME.attnlab-old-PID``), the new one renamed in, the old one deleted. A kill between the
  two renames leaves no ``NAME`` for an instant's work; :func:`recover` puts the old one back.

:func:`atomic_directory` wraps the three steps for a writer: it recovers, yields the hidden
directory to write into, and swaps it in when the block succeeds (a failed block leaves the old
directory as it was and removes the new one).

A killed process leaves hidden siblings behind. :func:`recover`, called before the next
replacement of the same ``NAME``, finishes its work: when ``NAME`` is missing it restores the old
directory (else a complete new one, as ``complete`` judges), and it deletes every other leftover
(an unfinished new directory, an old one already replaced), saying each in one line. A leftover
whose process is still running is left alone.

Cost: two renames (one with ``renameat2``), the deletion of the old tree, one ``listdir`` of the
parent per recovery. Users: an export folder (:mod:`attnlab.hf.export_out`), a probe's LoRA
directory (:mod:`attnlab.probe.artifacts`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import shutil
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

from attnlab.base.atomic import fsync_dir

NEW, OLD = "new", "old"
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def staging_dir(dest: Path, role: str = NEW) -> Path:
    """The hidden sibling of ``dest`` this process writes into (``role`` new) or moves the old
    directory to (``role`` old)."""
    return dest.with_name(f".{dest.name}.attnlab-{role}-{os.getpid()}")


def _exchange(a: Path, b: Path) -> bool:
    """Swap the names ``a`` and ``b`` atomically; False where the system cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _aside(dest: Path) -> Path:
    """Rename the old ``dest`` to its hidden ``old`` name (the fallback's first step)."""
    old = staging_dir(dest, OLD)
    os.rename(dest, old)
    return old


def replace_dir(new: Path, dest: Path) -> None:
    """Put the complete directory ``new`` (a sibling of ``dest``) at ``dest``, replacing what is
    there (see the module doc); the old directory is deleted last."""
    if not dest.exists() and not dest.is_symlink():
        os.rename(new, dest)
        fsync_dir(dest.parent)
        return
    if _exchange(new, dest):
        fsync_dir(dest.parent)
        shutil.rmtree(new, ignore_errors=True)  # it holds the old directory now
        return
    old = _aside(dest)
    os.rename(new, dest)
    fsync_dir(dest.parent)
    shutil.rmtree(old, ignore_errors=True)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def leftovers(dest: Path, legacy: str | None = None) -> list[tuple[Path, str, int]]:
    """(path, role, pid) of the hidden siblings a process left for ``dest``; ``legacy`` names an
    earlier attnlab's temporary (``.NAME.LEGACY-PID``), read as an unfinished new directory."""
    pattern = re.compile(rf"\.{re.escape(dest.name)}\.attnlab-(new|old)-(\d+)")
    earlier = (
        re.compile(rf"\.{re.escape(dest.name)}\.{re.escape(legacy)}-(\d+)") if legacy else None
    )
    out = []
    try:
        names = sorted(os.listdir(dest.parent))
    except OSError:
        return []
    for name in names:
        if m := pattern.fullmatch(name):
            out.append((dest.parent / name, m.group(1), int(m.group(2))))
        elif earlier is not None and (m := earlier.fullmatch(name)):
            out.append((dest.parent / name, NEW, int(m.group(1))))
    return [(p, role, pid) for p, role, pid in out if p.is_dir() and not p.is_symlink()]


def recover(dest: Path, complete: Callable[[Path], bool], legacy: str | None = None) -> list[str]:
    """Finish what a killed replacement of ``dest`` left (see the module doc); returns one
    sentence per thing done."""
    done = []
    found = [(p, role, pid) for p, role, pid in leftovers(dest, legacy) if not _alive(pid)]
    if not dest.exists() and not dest.is_symlink():
        olds = [p for p, role, _ in found if role == OLD and complete(p)]
        news = [p for p, role, _ in found if role == NEW and complete(p)]
        back = (olds or news or [None])[0]
        if back is not None:
            os.rename(back, dest)
            fsync_dir(dest.parent)
            which = "the folder it was replacing" if back in olds else "its finished new folder"
            done.append(f"{dest} was missing after a killed replacement: restored {which}")
            found = [f for f in found if f[0] != back]
    for path, _, pid in found:
        with contextlib.suppress(OSError):
            shutil.rmtree(path)
        done.append(f"removed {path.name}, left behind by a killed process ({pid})")
    return done


def _always(path: Path) -> bool:
    return True


@contextlib.contextmanager
def atomic_directory(
    final: str | os.PathLike,
    *,
    replace: bool,
    complete: Callable[[Path], bool] = _always,
    warning: type[Warning] = UserWarning,
) -> Iterator[Path]:
    """Yield a hidden sibling directory that becomes ``final`` only if the block succeeds,
    swapped in by :func:`replace_dir` (an existing ``final`` is replaced only with ``replace``,
    else :class:`FileExistsError`). What a killed earlier replacement of ``final`` left is
    recovered first (:func:`recover`, ``complete`` judging a leftover; each sentence a
    ``warning``)."""
    final = Path(os.path.abspath(final))
    final.parent.mkdir(parents=True, exist_ok=True)
    for sentence in recover(final, complete):
        warnings.warn(sentence, warning, stacklevel=3)
    tmp = staging_dir(final)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        if (final.exists() or final.is_symlink()) and not replace:
            raise FileExistsError(final)
        replace_dir(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
