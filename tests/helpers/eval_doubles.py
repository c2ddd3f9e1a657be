"""Small offline models and tokenizers for testing evaluation code (no download, CPU, seconds).

* :class:`ByteTokenizer`: UTF-8 bytes as ids 0..255 plus EOS = 256 (the attnlab tokenizer
  contract: ``encode``, ``decode``, ``eos_id``, ``vocab_size``, ``name``).
* :func:`tiny_hf_model`: a randomly initialised GPT-2 / Llama / GPT-NeoX causal LM of a few
  thousand parameters, built from a config.
* :func:`byte_hf_tokenizer`: a ``transformers`` fast tokenizer over the same byte vocabulary.
* :class:`TableLM`: a model whose next-token log-probabilities are an explicit function of the
  previous token, so expected scores can be computed by hand.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from attnlab.eval.lm import LanguageModel


class ByteTokenizer:
    """UTF-8 bytes -> ids 0..255; id 256 is EOS."""

    name = "bytes"
    vocab_size = 257
    eos_id = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def byte_hf_tokenizer():
    """A ``PreTrainedTokenizerFast`` giving the same ids as :class:`ByteTokenizer` (UTF-8 bytes
    0..255, ``<eos>`` = 256 as EOS and BOS), built offline with ``tokenizers``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: b for b, ch in _byte_level_alphabet().items()}
    vocab["<eos>"] = 256
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            pre_tokenizers.Split(pattern="", behavior="isolated"),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", bos_token="<eos>")


def _byte_level_alphabet() -> dict[int, str]:
    """GPT-2's byte-level map: printable bytes keep their character, the others are shifted to
    code points 256.. so every byte is a visible character."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += list(range(ord("®"), ord("ÿ") + 1))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def tiny_hf_model(arch: str = "gpt2", vocab_size: int = 257, max_length: int = 64, seed: int = 0):
    """A tiny random causal LM of family ``arch`` in {gpt2, llama, gpt_neox}."""
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        GPTNeoXConfig,
        GPTNeoXForCausalLM,
        LlamaConfig,
        LlamaForCausalLM,
    )

    torch.manual_seed(seed)
    if arch == "gpt2":
        cfg = GPT2Config(
            vocab_size=vocab_size, n_positions=max_length, n_embd=32, n_layer=2, n_head=2
        )
        model = GPT2LMHeadModel(cfg)
    elif arch == "llama":
        cfg = LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=max_length,
        )
        model = LlamaForCausalLM(cfg)
    elif arch == "gpt_neox":
        cfg = GPTNeoXConfig(
            vocab_size=vocab_size,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=max_length,
            rotary_pct=0.25,
        )
        model = GPTNeoXForCausalLM(cfg)
    else:
        raise ValueError(f"unknown arch {arch!r}; use gpt2, llama or gpt_neox")
    return model.eval()


class TableLM(LanguageModel):
    """A bigram 'model' over the byte vocabulary: the logits at a position are
    ``table(previous_token)`` (a function returning ``[V]`` logits), so every score is known in
    closed form. Works with the :class:`ByteTokenizer`."""

    def __init__(self, table: Callable[[int], Tensor], max_length: int = 32) -> None:
        self.table = table
        self.tokenizer = ByteTokenizer()
        self._max_length = max_length
        self.name = "table"
        self.calls: list[tuple[int, int]] = []

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def eos_id(self) -> int:
        return ByteTokenizer.eos_id

    @property
    def tokenizer_name(self) -> str:
        return "bytes"

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids)

    def logits(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        assert input_ids.shape[1] <= self.max_length, "fed more than max_length tokens"
        self.calls.append(tuple(input_ids.shape))
        rows = [torch.stack([self.table(int(t)) for t in row]) for row in input_ids]
        return torch.stack(rows).float()


class CausalBytesModel(nn.Module):
    """A tiny attnlab-style module (``forward(input_ids) -> object with .logits``) for testing
    :class:`attnlab.eval.native.AttnlabLM`: embedding, one causal self-attention, head."""

    def __init__(self, vocab_size: int = 257, d: int = 16, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.emb = nn.Embedding(vocab_size, d)
        self.attn = nn.MultiheadAttention(d, 2, batch_first=True)
        self.head = nn.Linear(d, vocab_size)

    def forward(self, input_ids: Tensor):
        from attnlab.model.output import ModelOutput

        x = self.emb(input_ids)
        T = x.shape[1]
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        h, _ = self.attn(x, x, x, attn_mask=mask, need_weights=False)
        return ModelOutput(logits=self.head(x + h))
