"""A retrieval database checked against its recorded hashes and the data it was built from,
cheaply enough for the start of every ``train``, ``eval`` and ``generate``.

:func:`verify_database` raises :class:`DatabaseIntegrityError` (a ``UserError``: the file and the
``attnlab data retrieval ... --restart`` command that rebuilds it) when

* ``meta.json`` or an index file is damaged (:meth:`Database.open`);
* the data's content hash (sha256 over its ``train.bin`` and ``val.bin`` hashes, from its
  ``meta.json``) is not the one the database was built from: other data, or data prepared again;
* the data directory's own files differ from its ``meta.json`` (:meth:`TokenData.verify`, which
  has its own cache);
* a file of the database (``train.npy``, ``val.npy``, the index files) differs from the sha256
  its ``meta.json`` records.

Each file is hashed once and the result cached in ``DIR/.verified.json`` under its stamp (size,
mtime_ns, ctime_ns, inode: ctime cannot be set back by a user); a later check costs one ``stat``
per file. ``full=True`` hashes everything again. A read-only directory is hashed every time.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from attnlab.base.atomic import atomic_write_json, sha256_file
from attnlab.base.errors import UserError
from attnlab.data.retrieval import Database, database_dir
from attnlab.data.retrieval_files import rebuild_command
from attnlab.data.retrieval_index.spec import IndexSpec, index_spec
from attnlab.data.tokendata import TokenData

CACHE = ".verified.json"


class DatabaseIntegrityError(UserError):
    """A retrieval database that is not the one its ``meta.json`` and its data describe."""


def _stamp(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _cache(directory: Path) -> dict[str, Any]:
    try:
        got = json.loads((directory / CACHE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return got if isinstance(got, dict) else {}


def _refuse(directory: Path, what: str) -> DatabaseIntegrityError:
    return DatabaseIntegrityError(
        f"{what}; a run would read neighbours other than the ones it was built with. Rebuild the "
        f"database with `{rebuild_command(directory)}`"
    )


def verify_database(directory: str | Path, data: TokenData, *, full: bool = False) -> Database:
    """The database in ``directory``, checked (module doc) against ``data``."""
    directory = Path(directory)
    db = Database.open(directory)
    built = db.meta.get("content_hash")
    if built != data.content_hash:
        raise _refuse(
            directory,
            f"{directory} was built from data with content hash {str(built)[:12]}..., but "
            f"{data.directory} now holds {data.content_hash[:12]}... (other data, or prepared again)",
        )
    data.verify(full=full)
    cache = {} if full else _cache(directory)
    fresh: dict[str, Any] = {}
    for name, want in sorted(db.meta["files"].items()):
        path = directory / name
        try:
            entry = {"stamp": _stamp(path.stat()), "sha256": want}
        except OSError:
            raise _refuse(directory, f"{path} is missing") from None
        if cache.get(name) != entry and sha256_file(path) != want:
            raise _refuse(directory, f"{path} does not match the sha256 its meta.json records")
        fresh[name] = entry
    if fresh != cache:
        with contextlib.suppress(OSError):  # read-only: hashed again next time
            atomic_write_json(directory / CACHE, fresh, indent=1)
    return db


def open_checked(
    data_dir: str | Path,
    chunk_size: int,
    neighbours: int,
    continuation: int,
    index: IndexSpec | None = None,
) -> Database:
    """The database of ``data_dir`` for these settings (``database_dir``), checked by
    :func:`verify_database` against the data: what ``train``, ``eval`` and ``generate`` open."""
    directory = database_dir(data_dir, chunk_size, neighbours, continuation, index)
    return verify_database(directory, TokenData.open(data_dir))


def run_index(retrieval: Any) -> IndexSpec:
    """The index of a run's ``model.retrieval`` (``index = "KIND"`` or ``"KIND:ENCODER"``); a
    bad value is a ``UserError`` naming the key."""
    kind, _, encoder = str(getattr(retrieval, "index", "") or "bm25-bigrams").partition(":")
    try:
        return index_spec(kind, encoder or None)
    except UserError as e:
        raise UserError(f"model.retrieval.index={retrieval.index!r}: {e}") from None


def open_run_database(retrieval: Any, data_dir: str | Path) -> Database:
    """The database a run with ``model.retrieval`` reads in ``data_dir``, checked
    (:func:`open_checked`): what ``train``, ``eval``, ``generate`` and ``export --verify`` open."""
    cont = retrieval.neighbour_len - retrieval.chunk_size
    return open_checked(
        data_dir, retrieval.chunk_size, retrieval.neighbours, cont, run_index(retrieval)
    )
