"""Route encoded documents to ``train.bin`` / ``val.bin`` by their split hash, in corpus order.

A document goes to validation iff ``u < val_fraction`` (:mod:`attnlab.data.split`). That rule
alone can leave a side empty on a tiny corpus; :func:`attnlab.data.split.assign_splits` then moves
the document with the smallest ``u`` to validation (or the largest to train). Streaming cannot
know this until the end, so the writer tracks the one candidate document of each side (its ``u``,
token offset and length: O(1) memory) and :meth:`SplitWriter.finish` moves it if needed, which
gives exactly the split ``assign_splits`` gives over all documents.

``state()`` is a JSON-able record of everything written so far; ``SplitWriter(..., state=s)``
continues from it (see :class:`attnlab.data.shards.ShardWriter`'s ``resume``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.base.atomic import sha256_file, temp_sibling
from attnlab.data.encoding import EncodedChunk
from attnlab.data.shards import SPLITS, ShardWriter, shard_path

_COPY_BLOCK = 1 << 20


class SplitWriter:
    """Both splits' shard writers, the document counts, and the empty-side candidates."""

    def __init__(
        self,
        directory: Path,
        dtype: np.dtype,
        vocab_size: int,
        val_fraction: float,
        state: dict[str, Any] | None = None,
    ) -> None:
        self.directory = directory
        self.dtype = dtype
        self.val_fraction = val_fraction
        state = state or {}
        done = state.get("splits", {})
        self.writers = {
            s: ShardWriter(
                shard_path(directory, s),
                dtype,
                vocab_size,
                resume=tuple(done[s]) if s in done else None,  # type: ignore[arg-type]
            )
            for s in SPLITS
        }
        self.text_bytes = int(state.get("text_bytes", 0))
        # [u, token offset, tokens] of the train doc with the smallest u / val doc with the largest
        self.candidate: dict[str, list[float] | None] = {
            "train": state.get("min_train"),
            "val": state.get("max_val"),
        }

    @property
    def documents(self) -> int:
        return sum(w.documents for w in self.writers.values())

    @property
    def tokens(self) -> int:
        return sum(w.tokens for w in self.writers.values())

    def write(self, enc: EncodedChunk, docs: list[bytes], take: int) -> None:
        """Write the first ``take`` documents of an encoded chunk."""
        u, lengths = enc.u[:take], enc.lengths[:take]
        ids = enc.ids[: int(lengths.sum())]
        is_val = u < self.val_fraction
        per_token = np.repeat(is_val, lengths)
        for split, mine in (("train", ~is_val), ("val", is_val)):
            w = self.writers[split]
            if mine.any():
                self._track(split, u[mine], lengths[mine], w.tokens)
                w.write(ids[per_token == (split == "val")], documents=int(mine.sum()))
        self.text_bytes += sum(len(d) for d in docs[:take])

    def _track(self, split: str, u: np.ndarray, lengths: np.ndarray, offset: int) -> None:
        j = int(np.argmin(u) if split == "train" else np.argmax(u))
        best = self.candidate[split]
        better = best is None or (u[j] < best[0] if split == "train" else u[j] > best[0])
        if better:  # strict: ties keep the earliest document, as np.argmin/argmax do
            start = offset + int(lengths[:j].sum())
            self.candidate[split] = [float(u[j]), start, int(lengths[j])]

    def state(self) -> dict[str, Any]:
        return {
            "splits": {s: [w.tokens, w.documents] for s, w in self.writers.items()},
            "text_bytes": self.text_bytes,
            "min_train": self.candidate["train"],
            "max_val": self.candidate["val"],
        }

    def files(self) -> list[Any]:
        return [w.file for w in self.writers.values()]

    def finish(self) -> dict[str, dict[str, Any]]:
        """Close the files, keep both sides non-empty, and return each split's record."""
        for w in self.writers.values():
            w.close()
        info = {
            s: {"tokens": w.tokens, "documents": w.documents, "sha256": w.sha256.hexdigest()}
            for s, w in self.writers.items()
        }
        if self.val_fraction > 0 and self.documents >= 2:
            if info["val"]["documents"] == 0:
                self._move("train", "val", info)
            elif info["train"]["documents"] == 0:
                self._move("val", "train", info)
        return {s: {"file": shard_path(self.directory, s).name, **info[s]} for s in SPLITS}

    def _move(self, src: str, dst: str, info: dict[str, dict[str, Any]]) -> None:
        """Move the candidate document of ``src`` into the empty ``dst`` (tiny corpora only)."""
        cand = self.candidate[src]
        assert cand is not None
        _, start, length = cand
        size = self.dtype.itemsize
        src_path, dst_path = shard_path(self.directory, src), shard_path(self.directory, dst)
        tmp = temp_sibling(src_path)
        with open(src_path, "rb") as f, open(tmp, "wb") as rest, open(dst_path, "wb") as moved:
            _copy(f, rest, int(start) * size)
            _copy(f, moved, int(length) * size)
            _copy(f, rest, None)
        os.replace(tmp, src_path)
        for split, delta in ((src, -1), (dst, 1)):
            info[split]["tokens"] += delta * int(length)
            info[split]["documents"] += delta
            info[split]["sha256"] = sha256_file(shard_path(self.directory, split))


def _copy(src: Any, dst: Any, n: int | None) -> None:
    """Copy ``n`` bytes (all that is left if None) in blocks."""
    while n is None or n > 0:
        block = src.read(_COPY_BLOCK if n is None else min(_COPY_BLOCK, n))
        if not block:
            return
        dst.write(block)
        if n is not None:
            n -= len(block)
