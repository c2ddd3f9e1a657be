"""The tokenizer interface every tokenizer implements (the members live in their own modules).

Every tokenizer maps ``str -> list[int]`` and back, has ``vocab_size`` (one more than its largest
id), an end-of-text id ``eos_id`` that separates documents in the token stream, and can ``save``
itself into a data directory so that directory is self-contained. The members
(:mod:`~attnlab.data.byte_tokenizer`, :mod:`~attnlab.data.gpt2_tokenizer`,
:mod:`~attnlab.data.hf_tokenizer`) import this module; :mod:`attnlab.data.tokenizer_lookup` finds
one by name (``load_tokenizer``) and imports only that member, so no module imports its importer.

Literal special-token text inside a document (``"<|endoftext|>"``) is encoded as ordinary
text, never as the end-of-text id, so document boundaries come only from ``prepare``.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.base.errors import UserError

EOT = "<|endoftext|>"
_BPE_NAME = re.compile(r"^bpe-(\d+)$")
BPE_MAX_VOCAB = 1 << 24


class Tokenizer(ABC):
    """``encode``/``decode`` plus the facts a model and a data file need."""

    name: str
    vocab_size: int
    eos_id: int

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added)."""

    @abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; invalid byte sequences become U+FFFD."""

    def encode_chunk(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(ids, lengths) on this thread only: ``ids`` the documents as one int64 stream, each
        followed by ``eos_id``; ``lengths[i]`` the token count of document ``i`` with its
        end-of-text.

        The unit of work of a ``prepare`` worker process, so it never starts threads itself.
        """
        flat: list[int] = []
        lengths = np.empty(len(texts), dtype=np.int64)
        for i, text in enumerate(texts):
            ids = self.encode(text)
            flat.extend(ids)
            flat.append(self.eos_id)
            lengths[i] = len(ids) + 1
        return np.array(flat, dtype=np.int64), lengths

    @abstractmethod
    def save(self, directory: Path) -> dict[str, Any]:
        """Write whatever files are needed into ``directory``; return the spec for meta.json."""

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "vocab_size": self.vocab_size, "eos_id": self.eos_id}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, vocab_size={self.vocab_size})"


def bpe_vocab_size(name: str) -> int | None:
    """``"bpe-4096"`` -> 4096; None for any other name."""
    m = _BPE_NAME.match(name)
    if not m:
        return None
    size = int(m.group(1))
    if size < 258:
        raise UserError(f"{name}: a byte-level BPE needs vocab >= 258 (256 bytes + end-of-text)")
    if size > BPE_MAX_VOCAB:  # the trainer's sizes are 32-bit: beyond, it aborts the process
        raise UserError(f"{name}: a byte-level BPE vocab must be at most {BPE_MAX_VOCAB:,}")
    return size
