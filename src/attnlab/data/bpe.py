"""``bpe-N``: a byte-level BPE of N ids trained on the corpus's train split with HF ``tokenizers``.

Byte-level as in GPT-2: text is cut by GPT-2's pre-tokenisation regex, mapped to 256 byte
symbols (no unknown token is possible), and merges are learned greedily by pair frequency until
the vocabulary has N entries: 1 end-of-text special (id 0) + 256 bytes + N - 257 merges.
Training reads only the train split, so validation text never shapes the vocabulary.
Cost: roughly linear in corpus size (a few seconds for wiki-sample on 2 cores); the result is
deterministic for a given corpus.
"""

from __future__ import annotations

from collections.abc import Iterable

from attnlab.data.hf_tokenizer import HFJsonTokenizer
from attnlab.data.tokenizer import EOT


def train_bpe(
    texts: Iterable[str],
    vocab_size: int,
    *,
    name: str | None = None,
    min_frequency: int = 2,
    length: int | None = None,
) -> HFJsonTokenizer:
    """Train a byte-level BPE with ``vocab_size`` ids (fewer if the corpus runs out of pairs)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=length)
    return HFJsonTokenizer(tok, name=name or f"bpe-{vocab_size}", eos_token=EOT)
