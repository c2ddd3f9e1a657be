"""Turn the system's failures into messages a user can act on (the CLI's last line of defence).

Specific cases raise :class:`~attnlab.base.errors.UserError` where they happen, with their own advice;
this module covers the rest of a class: any ``OSError`` (a full disk, a file-size limit, a
read-only or missing directory, a permission), ``MemoryError``, ``RecursionError`` (absurdly deep
input) and ``UnicodeError``, named by operation and file, never as a traceback.
"""

from __future__ import annotations

import errno
import os
import re

#: how Rust libraries (safetensors, tokenizers) print the OS error inside their own exceptions:
#: its Display form (``(os error 27)``) or, in older releases (safetensors 0.4), its Debug form
#: (``IoError(Os { code: 27, kind: FileTooLarge, message: "File too large" })``)
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)|\bOs \{ code: (\d+)")

_ADVICE = {
    errno.ENOSPC: "the disk is full; free space (or point --out at another disk) and rerun",
    errno.EDQUOT: "the disk quota is exhausted; free space and rerun",
    errno.EFBIG: "the file exceeds the file-size limit (ulimit -f) or the file system's largest "
    "file; raise the limit or write elsewhere",
    errno.EACCES: "permission denied; choose a path you can write, or fix its permissions",
    errno.EPERM: "the operation is not permitted there; choose another path",
    errno.EROFS: "that file system is read-only; choose a writable path",
    errno.ENOENT: "no such file or directory; check the path (its parent must exist and be "
    "writable)",
    errno.ENOTDIR: "a part of the path is a file, not a directory; check the path",
    errno.EISDIR: "a directory stands where a file is expected; check the path",
    errno.ENAMETOOLONG: "the file name is too long; use a shorter path",
    errno.EMFILE: "too many open files; raise the limit (ulimit -n)",
    errno.EIO: "an I/O error from the device; check the disk",
    errno.EPIPE: "the output pipe was closed",
}


def describe(exc: BaseException) -> str:
    """One message naming what failed, on which file, and what to do."""
    if isinstance(exc, OSError):
        files = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f)
        where = f" ({files})" if files else ""
        advice = _ADVICE.get(exc.errno or -1, "check the path, the disk and the permissions")
        reason = exc.strerror or str(exc) or type(exc).__name__
        return f"cannot read or write a file{where}: {reason}; {advice}"
    if isinstance(exc, MemoryError):
        return (
            "out of memory; lower the batch size, the sequence length or the model size "
            "(the preflight estimate did not foresee this allocation)"
        )
    if isinstance(exc, RecursionError):
        return (
            "the input is nested too deeply to read (e.g. a JSON line of thousands of nested "
            "brackets); check the files you gave"
        )
    if isinstance(exc, UnicodeError):
        return f"text is not valid UTF-8 ({exc}); save the file or argument as UTF-8"
    return f"{type(exc).__name__}: {exc}"


def os_error_of(exc: BaseException) -> OSError | None:
    """The OS error behind ``exc``: itself, one a library wrapped in its own exception type
    (e.g. safetensors' ``I/O error: File too large (os error 27)``), or one in its cause chain."""
    seen = 0
    e: BaseException | None = exc
    while e is not None and seen < 8:
        if isinstance(e, OSError):
            return e
        m = _RUST_OS_ERROR.search(str(e))
        if m:
            code = int(m.group(1) or m.group(2))
            return OSError(code, os.strerror(code))
        e, seen = e.__cause__ or e.__context__, seen + 1
    return None


#: the exceptions the CLI reports through :func:`describe` instead of a traceback
SYSTEM_FAILURES = (OSError, MemoryError, RecursionError, UnicodeError)
