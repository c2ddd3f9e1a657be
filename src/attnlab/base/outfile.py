"""One output file a user names (``inspect --out PAGE.html``, ``eval --out FILE``, ``bench --out
STEM``): attnlab replaces only a file it wrote, as it wrote it.

Such a file lies in the user's own folder, where no marker can say what is attnlab's, so the file
says it itself: it carries a **stamp**, ``attnlab-sha256:<64 hex>`` (in a comment of a page or a
Markdown file, under the key :data:`STAMP_KEY` of a JSON object), the SHA-256 of the file's own
bytes with the stamp's digits zeroed (:func:`stamp`). A stamp that checks out means attnlab wrote
the file and nobody changed it since (:func:`written_by_attnlab`).

:func:`claim_out_file`, the one check every such command makes (before its work, and again just
before it writes: :func:`write_out_text`), refuses, naming the cause:

- anything that is not a regular file (a directory, a device node, a FIFO) and a link, always;
- a path inside an attnlab directory (a run, an experiment, a probe, an export: its own files are
  never replaced by another command's output) or inside any run directory;
- an existing file without a stamp: the user's (``thesis.md``), or one an earlier attnlab wrote
  before it stamped its files; attnlab cannot tell the two apart, so the message says to move or
  delete it by hand (no flag replaces it);
- an existing file whose stamp does not check out: attnlab's but edited since (it is the user's
  now), with or without ``--force``;
- an earlier file of attnlab's, unless the command replaces it on purpose: ``--force``, or a
  file the command merges into (``eval --out``: ``merge=True``).

A format that cannot carry a stamp (a JSON-lines data set: each line is an item) is written only
as a new file (``stamped=False``): any existing file is refused.

Cost: one read and one SHA-256 of an existing file (these files are a few MB at most).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attnlab.base.errors import UserError

#: the stamp as it is written before its digest is known
PLACEHOLDER = "attnlab-sha256:" + "0" * 64
#: the key of a stamped JSON object that holds the stamp (:func:`stamped_json`)
STAMP_KEY = "attnlab_stamp"
_STAMP = re.compile(rb"attnlab-sha256:([0-9a-f]{64})")
#: files larger than this are not read to look for a stamp (no output of attnlab's is this big)
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


def markdown_stamp(command: str) -> str:
    """The closing line of a stamped Markdown (or HTML) file written by ``command``."""
    return f"<!-- written by {command}; {PLACEHOLDER} -->\n"


def stamped_json(obj: Mapping[str, Any], *, default: Any = None) -> str:
    """``obj`` as strict JSON text (attnlab's policy, :func:`attnlab.base.atomic.dumps_json`)
    with :data:`STAMP_KEY` added last, holding the placeholder: pass it to :func:`stamp`."""
    from attnlab.base.atomic import dumps_json

    body = {k: v for k, v in obj.items() if k != STAMP_KEY}
    return dumps_json({**body, STAMP_KEY: PLACEHOLDER}, indent=2, default=default) + "\n"


def read_json_out(path: str | os.PathLike) -> Any:
    """The JSON value of a stamped file, without its stamp key."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if isinstance(data, dict):
        data.pop(STAMP_KEY, None)
    return data


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


def _check_kind(p: Path, flag: str, what: str) -> None:
    """Refuse a path inside an attnlab directory, a link, and anything not a regular file."""
    from attnlab.base.safepath import check_out_file

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


def claim_out_file(
    path: str | os.PathLike,
    *,
    force: bool = False,
    flag: str = "--out",
    what: str = "file",
    merge: bool = False,
    stamped: bool = True,
    force_flag: str | None = "--force",
) -> Path:
    """Check that writing ``path`` replaces nothing of the user's (see the module doc).

    ``force``: replace an earlier file of attnlab's (``force_flag`` names the command's flag for
    it, None where it has none); ``merge``: the command merges into an earlier file of attnlab's
    (no ``force`` needed); ``stamped=False``: the format carries no stamp, so only a new file is
    written."""
    p = Path(path)
    _check_kind(p, flag, what)
    if not p.exists():
        return p
    by_hand = "move it away or delete it by hand, or give a new file name"
    if not stamped:
        raise UserError(
            f"{flag} {p} exists; attnlab writes the {what} only as a new file: {by_hand}"
        )
    mine = written_by_attnlab(p)
    if mine is None:
        no_flag = f" (not even with {force_flag})" if force_flag else ""
        raise UserError(
            f"{flag} {p} exists and carries no attnlab stamp: it was not written by attnlab, or "
            f"by an attnlab from before it stamped its {what}s, and attnlab cannot tell which. It "
            f"never replaces such a file{no_flag}: {by_hand}"
        )
    if mine is False:
        verb = "write into" if merge else "replace"
        raise UserError(
            f"{flag} {p} was written by attnlab but changed since: it is yours now, and attnlab "
            f"will not {verb} it: {by_hand}"
        )
    if merge or force:
        return p
    how = f"pass {force_flag} to replace it, or give" if force_flag else "give"
    raise UserError(f"{flag} {p} holds an earlier {what} of attnlab's; {how} a new file name")


def write_out_text(path: str | os.PathLike, text: str, **claim: Any) -> Path:
    """Write ``text`` (holding :data:`PLACEHOLDER` once) stamped, atomically, after claiming
    ``path`` again with ``claim`` (:func:`claim_out_file`'s keywords): a file that appeared or
    changed while the command worked is refused, not replaced."""
    from attnlab.base.atomic import atomic_write_text

    p = claim_out_file(path, **claim)
    atomic_write_text(p, stamp(text))
    return p


def write_new_text(path: str | os.PathLike, text: str, **claim: Any) -> Path:
    """Write ``text`` as a new file ``path`` (a format without a stamp: ``stamped=False``): the
    complete file is linked into place only if nothing has the name by then (``os.link`` fails
    on an existing name, atomically), so nothing is replaced, even a file that appeared while the
    command worked. Where the file system has no hard links, the claim is made again and the file
    renamed into place."""
    from attnlab.base.atomic import atomic_write_text, fsync_dir, temp_sibling

    p = claim_out_file(path, stamped=False, **claim)
    tmp = temp_sibling(p)
    atomic_write_text(tmp, text)
    try:
        os.link(tmp, p)
    except FileExistsError:
        claim_out_file(p, stamped=False, **claim)  # says what is there now
        raise UserError(f"{p} appeared while attnlab worked; give a new file name") from None
    except OSError:  # no hard links here (some network and FUSE file systems)
        claim_out_file(p, stamped=False, **claim)
        os.replace(tmp, p)
    finally:
        if tmp.exists():
            tmp.unlink()
    fsync_dir(p.parent)
    return p
