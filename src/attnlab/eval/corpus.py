"""Documents of a prepared corpus's validation split, in the evaluated model's own tokens.

A prepared corpus (``attnlab data prepare``) stores each split as one token stream with documents
separated by EOS. When the model uses the corpus's tokenizer the ids are scored as they are;
otherwise (a Hugging Face model on an attnlab corpus) every document is decoded to text and
re-encoded with the model's tokenizer, so any model can be scored on the same text and compared
by bits per byte.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from attnlab.base.errors import UserError
from attnlab.eval.lm import LanguageModel
from attnlab.eval.perplexity import Document, count_words


def split_documents(tokens: np.ndarray, eos_id: int) -> Iterator[np.ndarray]:
    """The non-empty runs of ``tokens`` between EOS ids."""
    bounds = np.flatnonzero(tokens == eos_id)
    start = 0
    for end in [*bounds.tolist(), len(tokens)]:
        if end > start:
            yield tokens[start:end]
        start = end + 1


def open_corpus(data_dir: str | Path):
    """``attnlab.data.TokenData.open(data_dir)`` with a clear error when it cannot be read."""
    path = Path(data_dir)
    if not path.is_dir():
        raise UserError(
            f"prepared corpus {str(path)!r} does not exist; make it with `attnlab data prepare` "
            "or give perplexity:DATA_DIR"
        )
    try:
        from attnlab.data import TokenData
    except ImportError as e:
        raise UserError(f"attnlab.data.TokenData is not available ({e}); update attnlab") from None
    return TokenData.open(path)


def corpus_texts(data_dir: str | Path, split: str = "val") -> Iterator[str]:
    """Decoded documents of a split (held-out text for building cloze sets)."""
    data = open_corpus(data_dir)
    tok = data.tokenizer
    for doc in split_documents(np.asarray(getattr(data, split)), int(tok.eos_id)):
        yield tok.decode(doc.tolist())


def corpus_documents(
    lm: LanguageModel, data_dir: str | Path, limit: int | None = None, split: str = "val"
) -> tuple[list[Document], bool]:
    """Up to ``limit`` documents of ``split`` in ``lm``'s tokens, with byte and word counts, and
    whether they were re-tokenized.

    The stored ids are used as they are only when the corpus's tokenizer has the model's name
    *and* re-encoding the first document's text gives back its ids (two ``bpe-4096`` tokenizers
    trained on different text share a name, not a vocabulary).
    """
    data = open_corpus(data_dir)
    tok = data.tokenizer
    docs = split_documents(np.asarray(getattr(data, split)), int(tok.eos_id))
    out: list[Document] = []
    same: bool | None = None
    for doc in docs:
        if limit is not None and len(out) >= limit:
            break
        ids = doc.astype(np.int64).tolist()
        text = tok.decode(ids)
        if same is None:
            same = lm.tokenizer_name == str(getattr(tok, "name", "")) and lm.encode(text) == ids
        if same:
            out.append(Document(ids, len(text.encode("utf-8")), count_words(text)))
        else:
            out.append(Document.from_text(lm, text))
    if not out:
        raise UserError(f"the {split} split of {data_dir} has no documents")
    return out, not same
