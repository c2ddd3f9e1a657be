"""``TokenData``: a prepared data directory opened for reading.

Layout written by :func:`attnlab.data.prepare`::

    DIR/meta.json        tokenizer, vocab_size, dtype, tokens/documents per split, hashes, source
    DIR/train.bin        train split token ids (uint16 or uint32), documents joined by eos
    DIR/val.bin          validation split, same format
    DIR/tokenizer.json   (or gpt2/, tokenizer/) what the tokenizer needs to load offline
    DIR/schedules/       fixed batch schedules (see attnlab.data.schedule)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.base.errors import UserError
from attnlab.data.shards import SPLITS, open_shard, shard_path
from attnlab.data.tokenizer import Tokenizer
from attnlab.data.tokenizer_lookup import tokenizer_from_spec
from attnlab.data.versioned import read_versioned_meta

FORMAT = "attnlab-token-shards"
FORMAT_VERSION = 1


def read_meta(directory: str | Path) -> dict[str, Any]:
    """``DIR/meta.json``, with a UserError when DIR is not a prepared data directory."""
    directory = Path(directory)
    path = directory / "meta.json"
    if not directory.exists():
        raise UserError(
            f"data directory {directory} does not exist; create it with "
            "attnlab data prepare --corpus wiki-sample --tokenizer bytes --out " + str(directory)
        )
    if not path.exists():
        raise UserError(
            f"{directory} has no meta.json, so it is not a prepared data directory; "
            "create one with attnlab data prepare --out DIR"
        )
    return read_versioned_meta(
        path,
        FORMAT,
        FORMAT_VERSION,
        "data directory",
        lambda problem: UserError(f"{path} {problem}; re-run attnlab data prepare"),
    )


@dataclass
class TokenData:
    """Memory-mapped splits plus their meta; ``tokenizer`` is loaded on first use."""

    directory: Path
    meta: dict[str, Any]
    train: np.ndarray
    val: np.ndarray

    @classmethod
    def open(cls, directory: str | Path, *, verify: bool = False) -> TokenData:
        """Open ``directory``; ``verify`` also re-hashes every file against meta.json and checks
        the vocabulary against the tokenizer (:meth:`verify`)."""
        directory = Path(directory)
        meta = read_meta(directory)
        dtype = np.dtype(meta["dtype"])
        arrays = {}
        for split in SPLITS:
            info = meta["splits"][split]
            path = shard_path(directory, split)
            arrays[split] = open_shard(path, dtype, int(info["tokens"]))
        data = cls(directory, meta, arrays["train"], arrays["val"])
        if verify:
            data.verify(full=True)
        return data

    def verify(self, *, full: bool = False) -> list[str]:
        """Check every recorded file against ``meta.json`` (sizes; sha256 on first use and after
        a change, or always with ``full``) and ``vocab_size`` against the tokenizer; the names
        checked (:mod:`attnlab.data.integrity`)."""
        from attnlab.data.integrity import check_vocab, verify_data

        names = verify_data(self.directory, self.meta, full=full)
        check_vocab(self.directory, self.meta, self.tokenizer.vocab_size)
        return names

    def split(self, name: str) -> np.ndarray:
        if name not in SPLITS:
            raise UserError(f"unknown split {name!r}; use one of {', '.join(SPLITS)}")
        return self.train if name == "train" else self.val

    @cached_property
    def tokenizer(self) -> Tokenizer:
        return tokenizer_from_spec(self.meta["tokenizer"], self.directory)

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    @property
    def eos_id(self) -> int:
        return int(self.meta["eos_id"])

    @property
    def content_hash(self) -> str:
        return str(self.meta["content_hash"])
