"""A run's tokenizer as files ``transformers.AutoTokenizer`` loads (no custom code needed).

- ``bytes``: a ``tokenizers`` byte-level BPE with the 256 byte symbols as its whole vocabulary and
  no merges, so every UTF-8 byte is one token and its id is the byte's value; ``<|endoftext|>``
  is the special token 256. Chosen over a Python ``PreTrainedTokenizer`` subclass shipped in the
  folder: it is one ``tokenizer.json`` that every tokenizers-based tool reads (fast tokenizer,
  vLLM, lm-eval, tokenizers in Rust), and it needs no ``trust_remote_code``.
- ``gpt2``: GPT-2's ``encoder.json`` + ``vocab.bpe`` through transformers' ``GPT2Tokenizer``
  (byte-level BPE, the same ids as tiktoken's).
- a ``tokenizer.json`` (``pythia``, ``bpe-N``, a path): that tokenizer, with its end-of-text token.
- a transformers tokenizer (a local directory, ``hf:NAME``): its own ``save_pretrained``.

In every case the end-of-text token is also the BOS and the padding token (GPT-2's convention),
which is what attnlab uses before a text with no context. One difference is kept on purpose:
attnlab encodes the literal text ``<|endoftext|>`` inside a document as ordinary text, while a
transformers tokenizer turns it into the special token (its standard behaviour; pass
``split_special_tokens=True`` to get attnlab's ids). :func:`write_tokenizer` checks that the
written tokenizer gives attnlab's ids on a sample text.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from attnlab.base.errors import UserError
from attnlab.data.tokenizer import EOT, Tokenizer

SAMPLE = "Hello world! attnlab's export, ünïcödé 123 -> 4.5\n\ttabs  and  spaces.\n"


def byte_level_alphabet() -> dict[int, str]:
    """GPT-2's byte-to-character map (the alphabet of tokenizers' ``ByteLevel``)."""
    from tokenizers import pre_tokenizers

    chars = pre_tokenizers.ByteLevel.alphabet()
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += list(range(ord("®"), ord("ÿ") + 1))
    out, shifted = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + shifted)
            shifted += 1
    assert set(out.values()) == set(chars)
    return out


def _bytes_tokenizer(max_len: int):
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: b for b, ch in byte_level_alphabet().items()}
    tok = RustTokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOT])  # id 256, after the 256 bytes
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOT,
        bos_token=EOT,
        pad_token=EOT,
        model_max_length=max_len,
        clean_up_tokenization_spaces=False,
    )


def hf_tokenizer(tok: Tokenizer, max_len: int) -> Any:
    """A transformers tokenizer giving ``tok``'s ids (see the module doc for each kind)."""
    from attnlab.data.byte_tokenizer import ByteTokenizer
    from attnlab.data.gpt2_tokenizer import GPT2Tokenizer
    from attnlab.data.hf_tokenizer import AutoTokenizerAdapter, HFJsonTokenizer

    common = {"model_max_length": max_len, "clean_up_tokenization_spaces": False}
    if isinstance(tok, ByteTokenizer):
        return _bytes_tokenizer(max_len)
    if isinstance(tok, GPT2Tokenizer):
        from transformers import GPT2Tokenizer as HFGPT2Tokenizer

        return HFGPT2Tokenizer(
            vocab_file=os.fspath(tok.encoder_path),
            merges_file=os.fspath(tok.vocab_path),
            eos_token=EOT,
            bos_token=EOT,
            unk_token=EOT,
            pad_token=EOT,
            add_prefix_space=False,
            **common,
        )
    if isinstance(tok, HFJsonTokenizer):
        from tokenizers import Tokenizer as RustTokenizer
        from transformers import PreTrainedTokenizerFast

        fresh = RustTokenizer.from_str(tok.tok.to_str())
        eos = tok.eos_token
        return PreTrainedTokenizerFast(
            tokenizer_object=fresh, eos_token=eos, bos_token=eos, pad_token=eos, **common
        )
    if isinstance(tok, AutoTokenizerAdapter):
        return tok.tok
    raise UserError(
        f"tokenizer {tok.name!r} ({type(tok).__name__}) has no Hugging Face form; export it with "
        "a bytes, gpt2, tokenizer.json or transformers tokenizer"
    )


def write_tokenizer(tok: Tokenizer, folder: Path, max_len: int) -> dict[str, Any]:
    """Save ``tok`` into ``folder`` for ``AutoTokenizer``; returns what the model card states."""
    from transformers import AutoTokenizer

    hf = hf_tokenizer(tok, max_len)
    hf.save_pretrained(os.fspath(folder))
    again = AutoTokenizer.from_pretrained(os.fspath(folder))
    ours = tok.encode(SAMPLE)
    theirs = again.encode(SAMPLE, add_special_tokens=False)
    if ours != theirs or again.eos_token_id != tok.eos_id:
        raise UserError(
            f"the exported tokenizer does not reproduce attnlab's {tok.name!r} ids on a sample "
            f"text ({ours[:12]} vs {theirs[:12]}); please report this"
        )
    return {
        "name": tok.name,
        "class": type(again).__name__,
        "vocab_size": tok.vocab_size,
        "eos_token": again.eos_token,
        "eos_token_id": tok.eos_id,
    }
