"""A token split read through small memory maps, for files larger than the address space allowed.

``np.memmap`` of a whole split costs no memory, but it does take the file's size in address
space, which ``ulimit -v`` (``RLIMIT_AS``) can forbid. ``WindowedShard`` has the part of the
ndarray interface that attnlab's readers use (``len``, ``dtype``, ``shape``, slices, integer-array
gathers such as ``batch_tokens``' ``data[window]``, ``np.asarray``) and maps, for each read, only
the span of the file it touches (per row for a 2-D gather), then unmaps it.
Cost: one ``mmap`` per read (or per gathered row): microseconds next to a training step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


class WindowedShard:
    """Read-only view of ``tokens`` ids of ``dtype`` in ``path``; every read maps only its span."""

    def __init__(self, path: Path, dtype: np.dtype, tokens: int) -> None:
        self.path = Path(path)
        self.dtype = np.dtype(dtype)
        self.shape = (int(tokens),)
        self.size = int(tokens)
        self.ndim = 1

    def __len__(self) -> int:
        return self.size

    def _read(self, start: int, stop: int) -> np.ndarray:
        if stop <= start:
            return np.zeros(0, dtype=self.dtype)
        view = np.memmap(
            self.path,
            dtype=self.dtype,
            mode="r",
            offset=start * self.dtype.itemsize,
            shape=(stop - start,),
        )
        out = np.array(view)
        del view
        return out

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(self.size)
            if step == 1:
                return self._read(start, stop)
            return self[np.arange(start, stop, step, dtype=np.int64)]
        if isinstance(index, (int, np.integer)):
            i = int(index) + (self.size if index < 0 else 0)
            if not 0 <= i < self.size:
                raise IndexError(f"index {index} is out of bounds for {self.size} tokens")
            return self._read(i, i + 1)[0]
        idx = np.asarray(index)
        if idx.dtype.kind not in "iu":
            raise TypeError(
                f"WindowedShard supports ints, slices and integer arrays, not {index!r}"
            )
        idx = np.where(idx < 0, idx + self.size, idx)
        if idx.size and (idx.min() < 0 or idx.max() >= self.size):
            raise IndexError(f"index out of bounds for {self.size} tokens")
        rows = idx.reshape(-1, idx.shape[-1]) if idx.ndim > 1 else idx.reshape(1, -1)
        out = np.empty(rows.shape, dtype=self.dtype)
        for r, row in enumerate(rows):
            if row.size:
                lo = int(row.min())
                out[r] = self._read(lo, int(row.max()) + 1)[row - lo]
        return out.reshape(idx.shape)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self._read(0, self.size)
        return out if dtype is None else out.astype(dtype)

    def __repr__(self) -> str:
        return f"WindowedShard({self.path}, {self.dtype}, {self.size} tokens)"
