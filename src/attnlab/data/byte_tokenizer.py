"""``bytes``: the tokenizer with nothing to learn. Ids 0..255 are UTF-8 bytes, 256 is end-of-text.

Cost: one id per byte (about 1.0-1.1 ids per character of English), vocab 257, no files.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.data.tokenizer import EOT, Tokenizer


class ByteTokenizer(Tokenizer):
    name = "bytes"
    vocab_size = 257
    eos_id = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        out, run = [], bytearray()
        for i in ids:
            if i == self.eos_id:
                out.append(run.decode("utf-8", errors="replace") + EOT)
                run = bytearray()
            else:
                run.append(int(i))
        out.append(run.decode("utf-8", errors="replace"))
        return "".join(out)

    def encode_chunk(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        encoded = [t.encode("utf-8") for t in texts]
        lengths = np.fromiter((len(b) + 1 for b in encoded), np.int64, len(encoded))
        if not encoded:
            return np.zeros(0, dtype=np.int64), lengths
        ids = np.frombuffer(b"\0".join(encoded) + b"\0", dtype=np.uint8).astype(np.int64)
        ids[np.cumsum(lengths) - 1] = self.eos_id
        return ids, lengths

    def save(self, directory: Path) -> dict[str, Any]:
        return {"kind": "bytes", "name": self.name}
