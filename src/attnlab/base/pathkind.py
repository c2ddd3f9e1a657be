"""What a path is, said in a message: "does not exist" only when nothing is there.

A command that needs a regular file and is given a directory, a device (``/dev/null``), a FIFO,
a socket or a broken link says which, so the user does not look for a typo in a path that is
there. Cost: one ``stat`` and one ``lstat``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISSOCK, "a socket"),
)


def kind(path: str | os.PathLike) -> str | None:
    """``"a directory"``, ``"a character device"``, ... for what ``path`` names; None for a
    regular file (through links) and for nothing at all."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def not_a_file(path: str | os.PathLike) -> str:
    """Why ``path`` is not a readable regular file, as the end of a sentence: ``"does not
    exist"``, ``"is a directory, not a file"``, ``"is a broken symbolic link (to X)"``, ..."""
    p = Path(path)
    found = kind(p)
    if found is not None:
        return f"is {found}, not a file"
    if p.is_symlink() and not p.exists():
        return f"is a broken symbolic link (to {os.readlink(p)})"
    if p.exists():  # a regular file after all (it appeared meanwhile)
        return "is not readable"
    return "does not exist"
