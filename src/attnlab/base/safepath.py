"""Where attnlab may write: inside the directory it was given, never through a link out of it.

A run or experiment directory may come from someone else (copied, unpacked, shared). A symbolic
link inside it, e.g. ``eval -> /home/you``, would make an ordinary results write land outside the
directory. Every writer into such a directory checks first:

* :func:`check_out_dir` -- an output directory that is a directory, or can be created, before any
  work starts (``--out /proc/x`` fails at once, with its reason);
* :func:`check_out_file` -- the same for an output file (its directory);
* :func:`check_tree` -- no link inside the directory leads out of it (checked once per command);
* :func:`inside` -- one path to be written resolves inside its root (checked per write).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from attnlab.base.errors import UserError


class UnsafePathError(UserError):
    """A write that would leave its directory through a symbolic link."""


def _leaves(root: Path, path: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
    except ValueError:
        return True
    return False


def inside(root: str | os.PathLike, path: str | os.PathLike) -> Path:
    """``path`` if it, with every link on the way resolved, stays inside ``root``; else an
    :class:`UnsafePathError` naming the link."""
    root, path = Path(root), Path(path)
    if not _leaves(root, path):
        return path
    link = next((p for p in [path, *path.parents] if p.is_symlink() and _leaves(root, p)), path)
    raise UnsafePathError(
        f"refusing to write {path}: {link} is a link to {os.path.realpath(link)}, outside "
        f"{root}. Replace the link by a real directory or file (or remove it) and rerun"
    )


def check_tree(root: str | os.PathLike) -> None:
    """Refuse a directory holding any symbolic link that resolves outside it (links are not
    followed while looking; a missing ``root`` passes)."""
    root = Path(root)
    if not root.is_dir():
        return
    base = root.resolve()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in (*dirnames, *filenames):
            p = Path(dirpath, name)
            if p.is_symlink() and _leaves(base, p):
                raise UnsafePathError(
                    f"{p} is a link to {os.path.realpath(p)}, outside {root}; attnlab writes "
                    f"into {root} and will not write through it. Replace the link by a real "
                    "directory or file (or remove it) and rerun"
                )


def check_out_file(path: str | os.PathLike, flag: str = "--out") -> Path:
    """An output file that is not a directory and whose directory exists or can be created."""
    p = Path(path)
    if p.is_dir():
        raise UserError(f"{flag} {p} is a directory; give a file name")
    if p.is_symlink() and not p.exists():
        raise UserError(f"{flag} {p} is a dangling link; remove it or give another file name")
    check_out_dir(p.parent, f"{flag} {p}: its directory", tree=False)
    if p.exists() and not os.access(p, os.W_OK):
        raise UserError(f"{flag} {p} is not writable; choose a file you can write")
    return p


def _probe_write(directory: Path, flag: str) -> None:
    """Create and delete a hidden file in ``directory``: the only test that also holds for root
    and for special file systems (``/proc``) where permission bits say nothing."""
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".attnlab-probe-"):
            pass
    except OSError as e:
        raise UserError(
            f"{flag}: cannot write in {directory} ({e.strerror or e}); choose a directory on a "
            "writable file system"
        ) from None


def check_out_dir(path: str | os.PathLike, flag: str = "--out", *, tree: bool = True) -> Path:
    """An output directory that exists as a directory or can be created (the first missing
    component is created and removed again to find out), and, with ``tree``, holds no link out
    of itself (:func:`check_tree`)."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UserError(f"{flag} {p} is a file; give a directory")
    if p.is_dir():
        _probe_write(p, flag)
        if tree:
            check_tree(p)
        return p
    missing = p
    while not missing.parent.exists() and missing.parent != missing:
        missing = missing.parent
    if not missing.parent.is_dir():
        raise UserError(f"{flag} {p}: {missing.parent} is a file, not a directory; check the path")
    try:
        missing.mkdir()
    except FileExistsError:  # made meanwhile by someone else: it exists now
        return p
    except OSError as e:
        raise UserError(
            f"{flag} {p} cannot be created ({e.strerror or e}: {missing}); choose a directory "
            "on a writable file system"
        ) from None
    with contextlib.suppress(OSError):
        missing.rmdir()
    return p
