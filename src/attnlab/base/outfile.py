"""One output file a user names (``attnlab inspect --out PAGE.html``): attnlab replaces only a file
it wrote, as it wrote it.

Such a file lies in the user's own folder, where no marker can say what is attnlab's, so the file
says it itself: it carries a **stamp**, ``attnlab-sha256:<64 hex>`` inside a comment, the SHA-256
of the file's own bytes with the stamp's digits zeroed (:func:`stamp`). A stamp that checks out
means attnlab wrote the file and nobody changed it since (:func:`written_by_attnlab`).

:func:`claim_out_file` refuses, naming the cause:

- anything that is not a regular file (a directory, a device node, a FIFO) and a link, always;
- a path inside an attnlab directory (a run, an experiment, a probe, an export: its own files are
  never replaced by another command's output) or inside any run directory;
- an existing file without a valid stamp: the user's (``thesis.md``), or attnlab's but edited
  since (then it is the user's now), with or without ``--force``;
- an earlier file of attnlab's without ``--force``.

Cost: one read and one SHA-256 of an existing file (pages are a few MB at most).
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from pathlib import Path

from attnlab.base.errors import UserError

#: the stamp as it is written before its digest is known
PLACEHOLDER = "attnlab-sha256:" + "0" * 64
_STAMP = re.compile(rb"attnlab-sha256:([0-9a-f]{64})")
#: files larger than this are not read to look for a stamp (no page of attnlab's is this big)
MAX_STAMPED_BYTES = 1 << 30
#: directory kinds whose files no other command's output may replace (attnlab.base.owned)
OWNED_KINDS = ("run", "experiment", "probe", "probe-experiment", "export")


def stamp(text: str) -> str:
    """``text``, which holds :data:`PLACEHOLDER` once, with the placeholder's digits replaced by
    the SHA-256 of ``text`` as it is (UTF-8)."""
    if text.count(PLACEHOLDER) != 1:
        raise ValueError("the text must hold the stamp placeholder exactly once")
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return text.replace(PLACEHOLDER, f"attnlab-sha256:{digest}")


def written_by_attnlab(path: str | os.PathLike) -> bool | None:
    """True: ``path`` carries a stamp that checks out (attnlab wrote it, unchanged since);
    False: it carries one that does not (edited since); None: no stamp (not attnlab's)."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_STAMPED_BYTES:
            return None
        data = path.read_bytes()
    except OSError:
        return None
    found = list(_STAMP.finditer(data))
    if not found:
        return None
    last = found[-1]
    zeroed = data[: last.start(1)] + b"0" * 64 + data[last.end(1) :]
    return hashlib.sha256(zeroed).hexdigest() == last.group(1).decode()


def _inside_owned(path: Path) -> Path | None:
    from attnlab.base.owned import enclosing_owned

    parent = Path(os.path.abspath(path)).parent
    home = enclosing_owned(parent, OWNED_KINDS)
    if home is not None:
        return home
    for d in [parent, *parent.parents]:  # a run directory an earlier attnlab wrote (no marker)
        if (d / "config.toml").is_file() and (d / "checkpoints").is_dir():
            return d
    return None


def claim_out_file(
    path: str | os.PathLike, *, force: bool = False, flag: str = "--out", what: str = "file"
) -> Path:
    """Check that writing ``path`` replaces nothing of the user's (see the module doc)."""
    from attnlab.base.safepath import check_out_file

    p = Path(path)
    home = _inside_owned(p)
    if home is not None:
        raise UserError(
            f"{flag} {p} lies inside the attnlab directory {home}, whose files attnlab keeps as "
            f"they are; write the {what} somewhere else"
        )
    if p.is_symlink():
        raise UserError(
            f"{flag} {p} is a link (to {os.path.realpath(p)}); attnlab does not write through "
            "links. Give a new file name"
        )
    if p.exists() and not p.is_dir() and not stat.S_ISREG(p.stat().st_mode):
        raise UserError(
            f"{flag} {p} is not a regular file (a device, a FIFO or a socket); give a new file name"
        )
    check_out_file(p, flag)
    if not p.exists():
        return p
    mine = written_by_attnlab(p)
    if mine is None:
        raise UserError(
            f"{flag} {p} exists and was not written by attnlab; attnlab never replaces a file "
            "it did not write. Give a new file name (or move it away)"
        )
    if mine is False:
        raise UserError(
            f"{flag} {p} was written by attnlab but changed since: it is yours now, and attnlab "
            "will not replace it. Give a new file name (or move it away)"
        )
    if not force:
        raise UserError(
            f"{flag} {p} holds an earlier {what} of attnlab's; pass --force to replace it, or give "
            "a new file name"
        )
    return p
