"""Tiny random transformers models and a tiny tokenizer, for offline tests and examples.

``save_tiny_model(kind, directory)`` writes a Hugging Face model directory (config.json, weights,
tokenizer files) that ``AutoModelForCausalLM.from_pretrained`` and the probe load like a real
checkpoint: GPT-NeoX (parallel residual, LayerNorm, partial rotary 0.25), Llama (GQA 4 query
heads over 2 K/V heads, RMSNorm) and GPT-2 (fused Conv1D qkv, learned positions).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

KINDS = ("gpt_neox", "llama", "gpt2")

SAMPLE_TEXT = (
    "The quick brown fox jumps over the lazy dog. A frozen probe trains only what it adds. "
    "Attention reads queries, keys and values; the content skip goes around it. "
    "Pythia uses a parallel residual, Llama uses RMSNorm and grouped keys, GPT-2 fuses q, k, v. "
)


def tiny_tokenizer(vocab_size: int = 320) -> Any:
    """A byte-level BPE trained on :data:`SAMPLE_TEXT`, as a transformers fast tokenizer with
    ``<|endoftext|>`` (id 0) as BOS/EOS. Deterministic."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([SAMPLE_TEXT] * 4, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>"
    )


def tiny_config(kind: str, vocab_size: int, d: int = 32, layers: int = 2) -> Any:
    from transformers import GPT2Config, GPTNeoXConfig, LlamaConfig

    if kind == "gpt_neox":
        return GPTNeoXConfig(
            vocab_size=vocab_size,
            hidden_size=d,
            num_hidden_layers=layers,
            num_attention_heads=4,
            intermediate_size=2 * d,
            max_position_embeddings=128,
            rotary_pct=0.25,
            use_parallel_residual=True,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            bos_token_id=0,
            eos_token_id=0,
        )
    if kind == "llama":
        return LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=d,
            intermediate_size=2 * d,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            bos_token_id=0,
            eos_token_id=0,
        )
    if kind == "gpt2":
        return GPT2Config(
            vocab_size=vocab_size,
            n_embd=d,
            n_layer=layers,
            n_head=4,
            n_positions=128,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=0,
            eos_token_id=0,
        )
    raise ValueError(f"unknown tiny model kind {kind!r}; choose from {KINDS}")


def tiny_model(kind: str, seed: int = 0, d: int = 32, layers: int = 2) -> tuple[Any, Any]:
    """(model in eval mode, tokenizer): a random ``kind`` model over the tiny tokenizer."""
    from transformers import AutoModelForCausalLM

    tok = tiny_tokenizer()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(kind, len(tok), d, layers))
    with torch.no_grad():  # untrained norms are exactly 1/0; perturb so tests see every weight
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval(), tok


def save_tiny_model(kind: str, directory: str | Path, seed: int = 0, **kw: Any) -> Path:
    """Write a tiny ``kind`` model and its tokenizer to ``directory`` (a local HF checkpoint)."""
    model, tok = tiny_model(kind, seed, **kw)
    directory = Path(directory)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


_NOUNS = ("river", "garden", "engine", "castle", "market", "violin", "harbor", "lantern", "forest")
_ADJS = ("old", "quiet", "bright", "narrow", "heavy", "green")
_VERBS = ("faces", "follows", "guards", "reaches", "crosses", "mirrors")


def write_corpus(path: str | Path, n_docs: int = 40, sentences: int = 24, seed: int = 0) -> Path:
    """A JSONL corpus of simple English sentences over a small vocabulary (nouns recur, so
    LAMBADA-style cloze passages can be built from it). Deterministic."""
    import json
    import random

    rng = random.Random(seed)
    lines = []
    for _ in range(n_docs):
        words = []
        for _ in range(sentences):
            a, n, v, m = (rng.choice(x) for x in (_ADJS, _NOUNS, _VERBS, _NOUNS))
            words.append(f"The {a} {n} {v} the {m}.")
        lines.append(json.dumps({"text": " ".join(words)}))
    path = Path(path)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
