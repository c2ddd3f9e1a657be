"""Speed peers: the same GPT-2-shaped network as other codebases write it.

- ``nanogpt``: nanoGPT's GPT, re-written for this benchmark in ``benchmarks/peers/nanogpt_model.py``
  (one fused ``c_attn`` matmul, bias-free LayerNorm, GELU MLP, tied ``wte``, flash SDPA);
- ``hf_gpt2``: Hugging Face ``GPT2LMHeadModel`` with the ``sdpa`` attention implementation (GPT-2
  as shipped: biases everywhere, tanh-GELU);
- ``x_transformers``: ``TransformerWrapper(Decoder(...))`` with flash attention, bias-free FFN and
  tied embeddings.

Each peer gets the base config's d_model, n_layers, n_heads, max_seq_len, vocab and FFN width.
Their forward FLOPs are counted exactly as attnlab counts its own (``flops_per_token``): 2 x every
matmul weight a token passes (``nn.Linear`` and GPT-2's transposed ``Conv1D``; a tied output head
that is not a module counted as ``2 d V``) plus ``4 T d_h`` per head per layer.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.parts import families

PEERS: tuple[str, ...] = ("nanogpt", "hf_gpt2", "x_transformers")
NANOGPT_FILE = "nanogpt_model.py"


class PeerUnavailableError(RuntimeError):
    """A peer cannot be built here (a package or file is missing); the reason says which."""


# ---------------------------------------------------------------------------------------- loading
def peers_dir() -> Path | None:
    """``benchmarks/peers`` of this checkout: $ATTNLAB_PEERS_DIR, above the package, or in cwd."""
    env = os.environ.get("ATTNLAB_PEERS_DIR")
    candidates = [Path(env)] if env else []
    here = Path(__file__).resolve()
    candidates += [p / "benchmarks" / "peers" for p in here.parents]
    candidates.append(Path.cwd() / "benchmarks" / "peers")
    for c in candidates:
        if (c / NANOGPT_FILE).is_file():
            return c
    return None


def load_nanogpt() -> ModuleType:
    """Import ``benchmarks/peers/nanogpt_model.py`` as a module (it is not part of the package)."""
    name = "attnlab_bench_peer_nanogpt"
    if name in sys.modules:
        return sys.modules[name]
    root = peers_dir()
    if root is None:
        raise PeerUnavailableError(
            f"benchmarks/peers/{NANOGPT_FILE} not found; run from an attnlab checkout or set "
            "ATTNLAB_PEERS_DIR"
        )
    spec = importlib.util.spec_from_file_location(name, root / NANOGPT_FILE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up while the file executes
    spec.loader.exec_module(mod)
    return mod


# --------------------------------------------------------------------------------------- building
def build_nanogpt(cfg: ModelConfig) -> nn.Module:
    mod = load_nanogpt()
    conf = mod.GPTConfig(
        block_size=cfg.max_seq_len,
        vocab_size=cfg.vocab_size,
        n_layer=cfg.n_layers,
        n_head=cfg.attention.n_heads,
        n_embd=cfg.d_model,
        dropout=0.0,
        bias=cfg.bias,
    )
    return mod.GPT(conf)


def build_hf_gpt2(cfg: ModelConfig) -> nn.Module:
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as e:
        raise PeerUnavailableError(
            f"transformers is not importable ({e}); pip install 'attnlab[bench]'"
        ) from None
    conf = GPT2Config(
        vocab_size=cfg.vocab_size,
        n_positions=cfg.max_seq_len,
        n_embd=cfg.d_model,
        n_layer=cfg.n_layers,
        n_head=cfg.attention.n_heads,
        n_inner=cfg.ffn_hidden,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=None,
        eos_token_id=None,
        tie_word_embeddings=True,
    )
    return GPT2LMHeadModel._from_config(conf, attn_implementation="sdpa")


def build_x_transformers(cfg: ModelConfig) -> nn.Module:
    try:
        from x_transformers import Decoder, TransformerWrapper
    except ImportError as e:
        raise PeerUnavailableError(
            f"x-transformers is not importable ({e}); pip install 'attnlab[bench]'"
        ) from None
    return TransformerWrapper(
        num_tokens=cfg.vocab_size,
        max_seq_len=cfg.max_seq_len,
        attn_layers=Decoder(
            dim=cfg.d_model,
            depth=cfg.n_layers,
            heads=cfg.attention.n_heads,
            attn_dim_head=cfg.head_dim,
            attn_flash=True,
            ff_mult=cfg.ffn_hidden / cfg.d_model,
            ff_no_bias=not cfg.bias,
        ),
        tie_embedding=True,
    )


BUILDERS: dict[str, Callable[[ModelConfig], nn.Module]] = {
    "nanogpt": build_nanogpt,
    "hf_gpt2": build_hf_gpt2,
    "x_transformers": build_x_transformers,
}

SUMMARIES: dict[str, str] = {
    "nanogpt": "nanoGPT GPT (benchmarks/peers/nanogpt_model.py), fused c_attn, flash SDPA",
    "hf_gpt2": "transformers GPT2LMHeadModel, attn_implementation='sdpa'",
    "x_transformers": "x-transformers TransformerWrapper(Decoder), attn_flash=True",
}


def build_peer(name: str, cfg: ModelConfig) -> nn.Module:
    """The peer network at the config's shapes (raises PeerUnavailableError when it cannot be built)."""
    if not families.of(cfg).has_peers:
        raise PeerUnavailableError(
            f"peers are GPT decoders; model.family={cfg.family!r} has no peer (peers exist for "
            f"{families.where(lambda f: f.has_peers)})"
        )
    return BUILDERS[name](cfg)


def peer_logits(name: str, model: nn.Module, x: Tensor) -> Tensor:
    """Logits [B, T, V] of a peer for every position."""
    if name == "nanogpt":
        # nanoGPT returns every position's logits only when given targets; any targets will do.
        logits, _ = model(x, x)
        return logits
    if name == "hf_gpt2":
        return model(input_ids=x, use_cache=False).logits
    return model(x)


def peer_loss(name: str, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """Mean next-token cross-entropy, computed the way each codebase's training loop does."""
    if name == "nanogpt":
        _, loss = model(x, y)
        return loss
    logits = peer_logits(name, model, x)
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), y.reshape(-1))


def peer_mismatches(name: str, cfg: ModelConfig) -> list[str]:
    """How the peer differs from the base config (empty when it is the same network)."""
    out = []
    if cfg.position.kind != "learned":
        out.append(f"learned positions (base: {cfg.position.kind})")
    if cfg.norm.kind != "layernorm":
        out.append(f"LayerNorm (base: {cfg.norm.kind})")
    if cfg.ffn.kind != "gelu":
        out.append(f"GELU MLP (base: {cfg.ffn.kind})")
    if cfg.residual_kind != "sequential" or cfg.norm_position != "pre":
        out.append("sequential pre-LN block (base differs)")
    if cfg.n_kv_heads != cfg.attention.n_heads:
        out.append(f"MHA (base: {cfg.n_kv_heads} K/V heads)")
    if not cfg.tie_embeddings:
        out.append("tied embeddings (base: untied)")
    if name == "hf_gpt2":
        if not cfg.bias or not cfg.norm.bias:
            out.append("biases in every Linear and LayerNorm (GPT-2 as shipped)")
        out.append("tanh-approximate GELU")
    if name == "x_transformers":
        out.append("scaled embeddings and tied logits (x d^-0.5)")
    if name == "nanogpt" and cfg.bias != cfg.norm.bias:
        out.append(f"one bias flag for Linear and LayerNorm (base: {cfg.bias}/{cfg.norm.bias})")
    if name == "nanogpt" and cfg.ffn_hidden != 4 * cfg.d_model:
        out.append(f"MLP 4d (base: {cfg.ffn_hidden})")
    return out


# ------------------------------------------------------------------------------------------ FLOPs
def matmul_weights(model: nn.Module) -> int:
    """Sum of in x out over every dense matmul module (nn.Linear, transformers' Conv1D), once
    per module object (a tied weight used by one module counts once)."""
    total, seen = 0, set()
    for m in model.modules():
        if id(m) in seen:
            continue
        seen.add(id(m))
        if isinstance(m, nn.Linear):
            total += m.in_features * m.out_features
        elif type(m).__name__ == "Conv1D" and getattr(m, "weight", None) is not None:
            total += m.weight.numel()
    return total


def peer_flops_per_token(name: str, model: nn.Module, cfg: ModelConfig, seq_len: int) -> int:
    """Forward FLOPs/token with attnlab's convention: 2 x matmul weights + 4 T d_h H per layer."""
    weights = matmul_weights(model)
    if name == "x_transformers" and not any(
        isinstance(m, nn.Linear) and m.out_features == cfg.vocab_size for m in model.modules()
    ):
        weights += cfg.d_model * cfg.vocab_size  # tied logits: t @ emb^T, not a module
    attention = 4 * seq_len * cfg.head_dim * cfg.attention.n_heads * cfg.n_layers
    return 2 * weights + attention


# ------------------------------------------------------------------------- equivalence (for tests)
@torch.no_grad()
def nanogpt_state_from_attnlab(model: nn.Module) -> dict[str, Tensor]:
    """nanoGPT state dict holding an attnlab GPT-2-shaped baseline's weights (W_Q, W_K, W_V stacked
    into ``c_attn``), so both compute the same function: the proof the comparison is like for like."""
    dec = model.decoder
    sd: dict[str, Tensor] = {
        "transformer.wte.weight": model.embed.weight,
        "lm_head.weight": model.lm_head.weight,
        "transformer.wpe.weight": model.abs_pos.table.weight,
    }

    def norm(prefix: str, n: nn.Module) -> None:
        sd[f"{prefix}.weight"] = n.weight
        if getattr(n, "bias", None) is not None:
            sd[f"{prefix}.bias"] = n.bias

    def linear(prefix: str, lin: nn.Linear) -> None:
        sd[f"{prefix}.weight"] = lin.weight
        if lin.bias is not None:
            sd[f"{prefix}.bias"] = lin.bias

    for i, b in enumerate(dec.blocks):
        p, a = f"transformer.h.{i}", b.attention
        norm(f"{p}.ln_1", b.norm1)
        norm(f"{p}.ln_2", b.norm2)
        lins = (a.query.w_q, a.key.w_k, a.value.w_v)
        sd[f"{p}.attn.c_attn.weight"] = torch.cat([lin.weight for lin in lins])
        if a.key.w_k.bias is not None:
            sd[f"{p}.attn.c_attn.bias"] = torch.cat([lin.bias for lin in lins])
        linear(f"{p}.attn.c_proj", a.mixer.w_o)
        linear(f"{p}.mlp.c_fc", b.ffn.w_in)
        linear(f"{p}.mlp.c_proj", b.ffn.w_out)
    norm("transformer.ln_f", dec.final_norm)
    return sd
