"""The corpus interface, and the registry that named sources register into.

A :class:`Corpus` yields documents (``str``) one at a time; a document is the unit of the
train/validation split and is followed by end-of-text in the token stream. A named source
(``wiki-sample``, ``dict-gcide``, ...) registers its factory and one-line description next to its
code with ``@register_corpus``. The members (:mod:`~attnlab.data.wiki`,
:mod:`~attnlab.data.debian`, :mod:`~attnlab.data.hub`, :mod:`~attnlab.data.local`) import this
module; :mod:`attnlab.data.corpus_lookup` resolves a ``--corpus`` string and imports the members
only then, so no module imports its importer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any


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


#: name -> factory and description, filled by ``@register_corpus``
REGISTRY: dict[str, _Entry] = {}


def register_corpus(
    name: str, description: str
) -> Callable[[Callable[[SourceOptions], Corpus]], Callable[[SourceOptions], Corpus]]:
    """Decorator: make ``factory(options) -> Corpus`` available as ``--corpus NAME``."""

    def deco(factory: Callable[[SourceOptions], Corpus]) -> Callable[[SourceOptions], Corpus]:
        REGISTRY[name] = _Entry(factory, description)
        return factory

    return deco
