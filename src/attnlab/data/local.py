"""Local text files as a corpus: ``.txt``, ``.jsonl``, ``.parquet`` (``.txt.gz``/``.jsonl.gz`` too).

Documents per file:

- ``.txt``: the whole file is one document. A file larger than ``TXT_SPLIT_CHARS`` (1 MiB of text)
  is cut at blank lines into documents of about ``TXT_CHUNK_CHARS`` (64 Ki characters; a paragraph
  is never split), so that one large text still yields enough documents for a validation split.
- ``.jsonl``: one document per line, from the string field ``text_field`` (default ``text``).
- ``.parquet``: one document per row of the column ``text_field`` (read in record batches).

A directory contributes every supported file under it (recursively, sorted); a glob contributes
its matches, sorted. Text must be UTF-8: an invalid byte is a ``UserError`` naming the file and
the byte offset, unless ``replace_invalid_utf8`` is set, which substitutes U+FFFD.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from attnlab.base.errors import UserError
from attnlab.base.jsonlines import json_lines
from attnlab.base.pathkind import kind, not_a_file
from attnlab.data.corpus import Corpus, SourceOptions

TXT_SPLIT_CHARS = 1 << 20
TXT_CHUNK_CHARS = 1 << 16
SUFFIXES = (".txt", ".jsonl", ".parquet", ".txt.gz", ".jsonl.gz")


def file_kind(path: Path) -> str | None:
    """``txt``, ``jsonl``, ``parquet``, or None for an unsupported file."""
    name = path.name.lower()
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return suffix.strip(".").split(".")[0]
    return None


def _open_binary(path: Path) -> IO[bytes]:
    return gzip.open(path, "rb") if path.name.lower().endswith(".gz") else open(path, "rb")


@contextlib.contextmanager
def _gzip_errors(path: Path) -> Iterator[None]:
    """A damaged or mislabelled ``.gz`` file as a :class:`UserError` naming it."""
    try:
        yield
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise UserError(
            f"{path}: not a valid gzip file ({e or 'truncated'}); decompress or repair it, or "
            "drop the .gz suffix if it is plain text"
        ) from None


def decode_utf8(data: bytes, path: Path, replace: bool, base_offset: int = 0) -> str:
    """Strict UTF-8 (a leading BOM dropped); the error names the file and the byte offset."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        if replace:
            text = data.decode("utf-8", errors="replace")
        else:
            offset = base_offset + e.start
            raise UserError(
                f"{path}: invalid UTF-8 at byte offset {offset} "
                f"(byte 0x{data[e.start]:02x}); fix the file or pass --replace-invalid-utf8 "
                "(data.replace_invalid_utf8 = true in a run config) "
                "to replace invalid bytes with U+FFFD"
            ) from None
    return text.removeprefix("\ufeff")


def split_long_text(text: str, chunk_chars: int | None = None) -> list[str]:
    """Cut at blank lines into pieces of about ``chunk_chars``; paragraphs stay whole."""
    chunk_chars = chunk_chars or TXT_CHUNK_CHARS
    pieces, cur, size = [], [], 0
    for para in text.split("\n\n"):
        if cur and size + len(para) > chunk_chars:
            pieces.append("\n\n".join(cur))
            cur, size = [], 0
        cur.append(para)
        size += len(para) + 2
    if cur:
        pieces.append("\n\n".join(cur))
    return [p for p in pieces if p.strip()]


def iter_txt(path: Path, options: SourceOptions) -> Iterator[str]:
    with _gzip_errors(path), _open_binary(path) as f:
        text = decode_utf8(f.read(), path, options.replace_invalid_utf8)
    if len(text) > TXT_SPLIT_CHARS:
        yield from split_long_text(text)
    else:
        yield text


def iter_jsonl(path: Path, options: SourceOptions) -> Iterator[str]:
    field = options.text_field

    def decode(raw: bytes, n: int, offset: int) -> str:
        return decode_utf8(raw, path, options.replace_invalid_utf8, base_offset=offset)

    with _gzip_errors(path), _open_binary(path) as f:
        for lineno, record in json_lines(f, path, decode):
            if not isinstance(record, dict) or field not in record:
                keys = sorted(record) if isinstance(record, dict) else type(record).__name__
                raise UserError(
                    f"{path}:{lineno}: no {field!r} field (found {keys}); "
                    "choose the text field with --text-field (data.text_field in a run config)"
                )
            value = record[field]
            if not isinstance(value, str):
                raise UserError(
                    f"{path}:{lineno}: field {field!r} is {type(value).__name__}, not a string"
                )
            yield value


def iter_parquet(path: Path, options: SourceOptions) -> Iterator[str]:
    from attnlab.base.extras import require

    require("data", "pyarrow", what=f"reading the Parquet file {path}")
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise UserError(f"{path}: not a readable Parquet file ({e})") from None
    field = options.text_field
    names = pf.schema_arrow.names
    if field not in names:
        raise UserError(
            f"{path}: no column {field!r} (columns: {names}); choose one with --text-field "
            "(data.text_field in a run config)"
        )
    kind = pf.schema_arrow.field(field).type
    is_binary = pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
    if not (is_binary or pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise UserError(f"{path}: column {field!r} has type {kind}, not string")
    for batch in pf.iter_batches(columns=[field], batch_size=4096):
        for value in batch.column(0).to_pylist():
            if value is None:
                continue
            if is_binary:
                value = decode_utf8(value, path, options.replace_invalid_utf8)
            yield value


_READERS = {"txt": iter_txt, "jsonl": iter_jsonl, "parquet": iter_parquet}


class LocalFiles(Corpus):
    """Documents from a fixed, sorted list of local files."""

    def __init__(self, name: str, files: list[Path], options: SourceOptions, spec: str) -> None:
        self.name = name
        self.files = files
        self.options = options
        self.spec = spec

    @classmethod
    def from_path(cls, path: Path, options: SourceOptions) -> LocalFiles:
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and file_kind(p))
            if not files:
                raise UserError(
                    f"directory {path} has no {'/'.join(SUFFIXES)} files; "
                    "point --corpus (data.corpus in a run config) at a file, a glob, or a "
                    "directory with text files"
                )
            return cls(_slug(path.resolve().name), files, options, str(path))
        if kind(path) is not None:  # a device or a pipe: reading it may never end
            raise UserError(f"corpus path {str(path)!r} {not_a_file(path)}")
        if not file_kind(path):
            raise UserError(f"{path}: unsupported file type; use one of {', '.join(SUFFIXES)}")
        return cls(_slug(_stem(path)), [path], options, str(path))

    @classmethod
    def from_glob(cls, pattern: str, matches: list[Path], options: SourceOptions) -> LocalFiles:
        files = [m for m in matches if m.is_file()]
        unsupported = [str(m) for m in files if not file_kind(m)]
        if unsupported:
            raise UserError(
                f"corpus glob {pattern!r} matched unsupported files {unsupported[:3]}; "
                f"narrow the pattern to {', '.join(SUFFIXES)} files"
            )
        if not files:
            raise UserError(f"corpus glob {pattern!r} matched no files; check the pattern")
        return cls(_slug(_stem(Path(pattern.split("*")[0] or "glob"))), files, options, pattern)

    def documents(self) -> Iterator[str]:
        for path in self.files:
            kind = file_kind(path)
            assert kind is not None
            yield from _READERS[kind](path, self.options)

    def fingerprint(self) -> Any:
        return [[os.fspath(p), p.stat().st_size, p.stat().st_mtime_ns] for p in self.files]

    def size_hint(self) -> int | None:
        if any(p.name.lower().endswith(".gz") for p in self.files):
            return None
        return sum(p.stat().st_size for p in self.files)

    def attribution(self) -> dict[str, Any]:
        return {
            "source": self.spec,
            "files": [os.fspath(p) for p in self.files[:100]],
            "n_files": len(self.files),
        }


def _stem(path: Path) -> str:
    name = path.name
    for suffix in SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return path.stem or "corpus"


def _slug(text: str) -> str:
    out = "".join(c if c.isalnum() or c in "-_." else "-" for c in text).strip("-.")
    return out or "corpus"
