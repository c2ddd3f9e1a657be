"""``load_tokenizer``: a tokenizer from a name, a path, or a prepared data dir.

The lookup sits beside the interface (:mod:`attnlab.data.tokenizer`), not in it: the members
import the interface, this module imports a member only when its name is asked for (``bytes``
never loads tiktoken, ``transformers`` or ``tokenizers``). Names:

==============  ===================================================================  ==========
name            what                                                                 vocab
==============  ===================================================================  ==========
bytes           UTF-8 bytes, id 256 = end-of-text                                    257
bpe-4096/-8192  byte-level BPE trained on the corpus's train split (any ``bpe-N``)   N
gpt2            GPT-2's BPE through tiktoken, from local files (eot 50256)           50257
pythia          GPT-NeoX-20B / Pythia tokenizer.json (eot 0)                          50277
PATH            a tokenizer.json file, or a local Hugging Face tokenizer directory   -
hf:NAME         a Hub tokenizer through transformers.AutoTokenizer (online)          -
==============  ===================================================================  ==========
"""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path
from typing import Any

from attnlab.base.errors import UserError
from attnlab.base.pathkind import not_a_file
from attnlab.data.tokenizer import Tokenizer, bpe_vocab_size

BUILTIN_NAMES = ("bytes", "bpe-4096", "bpe-8192", "gpt2", "pythia")


def tokenizer_from_spec(spec: dict[str, Any], directory: Path) -> Tokenizer:
    """Rebuild the tokenizer a data directory was prepared with (see ``Tokenizer.save``)."""
    kind = spec.get("kind")
    if kind == "bytes":
        from attnlab.data.byte_tokenizer import ByteTokenizer

        return ByteTokenizer()
    if kind == "gpt2":
        from attnlab.data.gpt2_tokenizer import GPT2Tokenizer

        return GPT2Tokenizer.from_files(
            directory / spec["encoder"], directory / spec["vocab"], name=spec["name"]
        )
    if kind == "hf-json":
        from attnlab.data.hf_tokenizer import HFJsonTokenizer

        return HFJsonTokenizer.from_file(
            directory / spec["file"], name=spec["name"], eos_token=spec["eos_token"]
        )
    if kind == "hf-auto":
        from attnlab.data.hf_tokenizer import AutoTokenizerAdapter

        return AutoTokenizerAdapter(str(directory / spec["dir"]), name=spec["name"], local=True)
    raise UserError(
        f"{directory}/meta.json names an unknown tokenizer kind {kind!r}; "
        "re-run attnlab data prepare with this attnlab version"
    )


def _from_data_dir(directory: Path, wanted: str | None) -> Tokenizer:
    meta_path = directory / "meta.json"
    if not meta_path.exists():
        raise UserError(
            f"{directory} is not a prepared data directory (no meta.json); "
            "create it with: attnlab data prepare --corpus ... --tokenizer ... --out DIR"
        )
    spec = json.loads(meta_path.read_text())["tokenizer"]
    if wanted is not None and wanted != spec["name"]:
        raise UserError(
            f"{directory} was prepared with tokenizer {spec['name']!r}, not {wanted!r}; "
            "prepare a new data directory for this tokenizer"
        )
    return tokenizer_from_spec(spec, directory)


def load_tokenizer(name_or_path: str | None, data_dir: str | Path | None = None) -> Tokenizer:
    """A tokenizer by name or path (table above), or the one saved in a prepared ``data_dir``.

    With ``data_dir``, the saved tokenizer is returned (``name_or_path``, if given, must match the
    name it was prepared with). Corpus-trained names (``bpe-N``) exist only in a data dir.
    """
    if data_dir is not None:
        return _from_data_dir(Path(data_dir), name_or_path)
    if not name_or_path:
        raise UserError("no tokenizer given: use bytes, bpe-4096, gpt2, pythia or a path")
    name = name_or_path.strip()
    if name == "bytes":
        from attnlab.data.byte_tokenizer import ByteTokenizer

        return ByteTokenizer()
    if name == "gpt2":
        from attnlab.data.gpt2_tokenizer import GPT2Tokenizer

        return GPT2Tokenizer.from_package()
    if name == "pythia":
        from attnlab.data.hf_tokenizer import pythia_tokenizer

        return pythia_tokenizer()
    if bpe_vocab_size(name) is not None:
        raise UserError(
            f"{name} is trained on a corpus: prepare one with "
            f"attnlab data prepare --tokenizer {name} --out DIR, then load it from DIR"
        )
    if name.startswith("hf:"):
        from attnlab.data.hf_tokenizer import AutoTokenizerAdapter

        return AutoTokenizerAdapter(name.removeprefix("hf:"), name=name, local=False)
    path = Path(name).expanduser()
    if path.is_dir() and (path / "meta.json").exists():
        return _from_data_dir(path, None)
    if path.is_file():
        from attnlab.data.hf_tokenizer import HFJsonTokenizer

        return HFJsonTokenizer.from_file(path, name=str(path))
    if path.is_dir():
        from attnlab.data.hf_tokenizer import AutoTokenizerAdapter

        return AutoTokenizerAdapter(str(path), name=str(path), local=True)
    if path.suffix.lower() == ".json":
        raise UserError(f"tokenizer file {name!r} {not_a_file(path)}")
    if re.fullmatch(r"[\w.-]+/[\w.-]+", name) and not name.startswith((".", "/")):
        from attnlab.data.hf_tokenizer import AutoTokenizerAdapter

        return AutoTokenizerAdapter(name, name=f"hf:{name}", local=False)
    if "/" in name or path.suffix:
        raise UserError(f"tokenizer path {name!r} {not_a_file(path)}")
    near = difflib.get_close_matches(name, BUILTIN_NAMES, n=1)
    hint = f"did you mean {near[0]!r}? " if near else ""
    raise UserError(
        f"unknown tokenizer {name!r}: {hint}use one of {', '.join(BUILTIN_NAMES)}, bpe-N, "
        "a tokenizer.json path, a local tokenizer directory, or hf:ORG/NAME"
    )
