"""Token shard files: flat little-endian arrays of token ids (the nanoGPT ``.bin`` format).

``train.bin`` / ``val.bin`` hold every document's ids followed by end-of-text, back to back, as
``uint16`` when the vocabulary fits (<= 65536 ids, 2 bytes/token) and ``uint32`` otherwise
(<= 2**32 ids). They are read with ``np.memmap``, so opening costs nothing and a batch reads only
the pages it touches.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

import numpy as np

from attnlab.base.errors import UserError

SPLITS = ("train", "val")
_HASH_BLOCK = 1 << 20


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned dtype that holds ids ``0 .. vocab_size - 1``."""
    if vocab_size <= 0:
        raise UserError(f"vocab_size={vocab_size} must be positive")
    if vocab_size <= 2**16:
        return np.dtype("<u2")
    if vocab_size <= 2**32:
        return np.dtype("<u4")
    raise UserError(
        f"vocab_size={vocab_size} exceeds 2**32 and cannot be stored in uint32 token files; "
        "use a tokenizer with fewer ids"
    )


def shard_path(directory: Path, split: str) -> Path:
    return directory / f"{split}.bin"


class ShardWriter:
    """Append token ids to one split's file, counting them and hashing the bytes written.

    ``resume=(tokens, documents)`` continues a file an interrupted run wrote: it is cut to its
    first ``tokens`` ids (what a progress record vouches for) and those bytes are hashed again
    (streamed, 1 MiB at a time), so the final sha256 covers the whole file.
    """

    def __init__(
        self,
        path: Path,
        dtype: np.dtype,
        vocab_size: int,
        resume: tuple[int, int] | None = None,
    ) -> None:
        self.path = path
        self.dtype = dtype
        self.vocab_size = vocab_size
        self.tokens = 0
        self.documents = 0
        self.sha256 = hashlib.sha256()
        if resume is None:
            self._file: BinaryIO = open(path, "wb")  # noqa: SIM115 (closed in close/__exit__)
            return
        self.tokens, self.documents = resume
        size = self.tokens * dtype.itemsize
        self._file = open(path, "r+b")  # noqa: SIM115
        if os.fstat(self._file.fileno()).st_size < size:
            self._file.close()
            raise UserError(f"{path} is shorter than its progress record; prepare again")
        self._file.truncate(size)
        while chunk := self._file.read(min(_HASH_BLOCK, size - self._file.tell())):
            self.sha256.update(chunk)
        self._file.seek(size)

    @property
    def file(self) -> BinaryIO:
        return self._file

    def write(self, ids: np.ndarray, documents: int) -> None:
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise UserError(
                f"tokenizer produced id {int(ids.max())} outside its vocab_size "
                f"{self.vocab_size}; the tokenizer file is inconsistent"
            )
        data = ids.astype(self.dtype, copy=False).tobytes()
        self._file.write(data)
        self.sha256.update(data)
        self.tokens += int(ids.size)
        self.documents += documents

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def open_shard(path: Path, dtype: np.dtype, tokens: int) -> np.ndarray:
    """Read-only memmap of a split (a plain empty array when it holds no tokens).

    Mapping a file takes address space, not memory. Where even that is capped below the file's
    size (``ulimit -v``), the split is a :class:`attnlab.data.windowed.WindowedShard`, which
    maps only the windows a read touches."""
    if not path.exists():
        raise UserError(f"{path} is missing; re-run attnlab data prepare for this directory")
    expected = tokens * dtype.itemsize
    actual = path.stat().st_size
    if actual != expected:
        raise UserError(
            f"{path} has {actual} bytes but meta.json says {tokens} tokens ({expected} bytes); "
            "the directory is corrupt or half-copied: re-run attnlab data prepare"
        )
    if tokens == 0:
        return np.zeros(0, dtype=dtype)
    try:
        return np.memmap(path, dtype=dtype, mode="r", shape=(tokens,))
    except (OSError, ValueError, MemoryError):  # no address space for the whole file (ulimit -v)
        from attnlab.data.windowed import WindowedShard

        return WindowedShard(path, dtype, tokens)  # type: ignore[return-value]
