"""Corpus sources behind one interface, and the dispatch from a ``--corpus`` string to a source.

A :class:`Corpus` yields documents (``str``) one at a time; a document is the unit of the
train/validation split and is followed by end-of-text in the token stream. ``open_corpus``
resolves, in order:

1. a registered name (``wiki-sample``, ``dict-gcide``, ``wordnet``, ``bible-kjv``, ``python-doc``);
2. ``hf:NAME[:CONFIG]``, a Hugging Face dataset (online only);
3. an existing local file or directory (``.txt``, ``.jsonl``, ``.parquet``, optionally ``.gz``);
4. a glob pattern (``data/*.jsonl``, ``books/**/*.txt``).

Anything else is a :class:`~attnlab.errors.UserError` naming the nearest registered source.
"""

from __future__ import annotations

import difflib
import glob
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlab.errors import UserError


@dataclass(frozen=True)
class SourceOptions:
    """How text is read: the JSONL/Parquet field, and what to do with invalid UTF-8."""

    text_field: str = "text"
    replace_invalid_utf8: bool = False


class Corpus(ABC):
    """A named stream of documents.

    ``name`` is short and file-name safe (it names the default data directory); ``attribution()``
    says where the text came from and under which license; it is read after ``documents()`` is
    exhausted, so a source may report what it saw (e.g. article titles).
    """

    name: str

    @abstractmethod
    def documents(self) -> Iterator[str]:
        """Yield the documents in a fixed order."""

    def attribution(self) -> dict[str, Any]:
        return {"source": self.name}

    def fingerprint(self) -> Any:
        """JSON-able facts that change when the source's content does (e.g. file sizes and
        modification times), so an interrupted prepare never resumes over edited input."""
        return None

    def size_hint(self) -> int | None:
        """About how many bytes of text ``documents()`` yields (for a progress ETA), if known."""
        return None


@dataclass(frozen=True)
class _Entry:
    factory: Callable[[SourceOptions], Corpus]
    description: str


_REGISTRY: dict[str, _Entry] = {}


def register_corpus(
    name: str, description: str
) -> Callable[[Callable[[SourceOptions], Corpus]], Callable[[SourceOptions], Corpus]]:
    """Decorator: make ``factory(options) -> Corpus`` available as ``--corpus NAME``."""

    def deco(factory: Callable[[SourceOptions], Corpus]) -> Callable[[SourceOptions], Corpus]:
        _REGISTRY[name] = _Entry(factory, description)
        return factory

    return deco


def registered_corpora() -> dict[str, str]:
    """Registered source names and their one-line descriptions."""
    _load_builtin_sources()
    return {k: v.description for k, v in sorted(_REGISTRY.items())}


def _load_builtin_sources() -> None:
    # Imported for their @register_corpus side effect.
    from attnlab.data import debian, wiki  # noqa: F401


def _has_glob(spec: str) -> bool:
    return any(c in spec for c in "*?[")


def open_corpus(
    spec: str, *, text_field: str = "text", replace_invalid_utf8: bool = False
) -> Corpus:
    """Resolve a ``--corpus`` string (see the module docstring) into a :class:`Corpus`."""
    _load_builtin_sources()
    options = SourceOptions(text_field=text_field, replace_invalid_utf8=replace_invalid_utf8)
    spec = spec.strip()
    if not spec:
        raise UserError("empty corpus name: use wiki-sample, hf:NAME, or a local file/dir/glob")
    if spec in _REGISTRY:
        return _REGISTRY[spec].factory(options)
    if spec.startswith("hf:"):
        from attnlab.data.hub import HubCorpus

        return HubCorpus.from_spec(spec, options)

    from attnlab.data.local import LocalFiles

    path = Path(spec).expanduser()
    if path.exists():
        return LocalFiles.from_path(path, options)
    if _has_glob(spec):
        matches = sorted(glob.glob(str(path), recursive=True))
        if not matches:
            raise UserError(f"corpus glob {spec!r} matched no files; check the pattern")
        return LocalFiles.from_glob(spec, [Path(m) for m in matches], options)
    if "/" in spec or "\\" in spec or path.suffix:
        raise UserError(f"corpus path {spec!r} does not exist")
    near = difflib.get_close_matches(spec, list(_REGISTRY), n=1)
    hint = f"did you mean {near[0]!r}? " if near else ""
    raise UserError(
        f"unknown corpus {spec!r}: {hint}known sources are {', '.join(sorted(_REGISTRY))}; "
        "or give hf:NAME[:CONFIG], a local .txt/.jsonl/.parquet file, a directory or a glob"
    )
