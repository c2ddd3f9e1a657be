"""What a trained run's weights say, read from its final checkpoint:

- content skip (seed 000, its Figure 2): ``||W_skip||_F`` of every layer;
- attention maps: the per-layer probabilities ``[H, T, T]`` on one fixed validation sequence (the
  first ``T`` tokens of the validation split, the same for every run of a data directory);
- identity head (seed 004): the data-dependent head weights ``w = u W_w + b`` over the ``H + 1``
  heads, averaged over the sequence's tokens, per layer.

Each costs one forward pass of a single sequence on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch


def _blocks(model) -> list:
    stack = model.decoder if model.decoder is not None else model.encoder
    return list(stack.blocks)


def skip_norms(run_dir: str | Path) -> list[float] | None:
    """Per-layer ``||W_skip||_F`` of a run's final checkpoint; None without a content skip."""
    from attnlab.runs.load import load_run_model

    model, cfg, _ = load_run_model(run_dir)
    if not cfg.model.content_skip.enabled:
        return None
    return [b.content_skip.norm() for b in _blocks(model) if b.content_skip is not None]


@dataclass
class AttentionProbe:
    """Attention maps and identity-head weights of one run on one sequence."""

    maps: list[np.ndarray]  # per layer (per loop slot), [H, T, T]
    head_weights: list[np.ndarray] | None  # per layer, [H + 1] mean over tokens (last = identity)
    text: str  # the sequence, decoded
    virtual: bool


def probe_sequence(data_dir: str | Path, n_tokens: int) -> np.ndarray:
    """The first ``n_tokens`` tokens of the validation split (a fixed sequence)."""
    from attnlab.data import TokenData

    data = TokenData.open(Path(data_dir))
    return np.asarray(data.val[:n_tokens], dtype=np.int64)


@torch.no_grad()
def attention_probe(run_dir: str | Path, n_tokens: int = 48) -> AttentionProbe:
    """Run the final checkpoint on the fixed validation sequence with ``return_attn=True``."""
    from attnlab.runs.load import load_run_model

    model, cfg, tokenizer = load_run_model(run_dir)
    n = min(n_tokens, cfg.data.seq_len, cfg.model.max_seq_len)
    ids = probe_sequence(cfg.data.dir, n)
    weights: list[torch.Tensor] = []
    hooks = []
    for b in _blocks(model):
        ih = getattr(b.attention, "identity_head", None)
        if ih is not None:
            hooks.append(
                ih.head_weights.register_forward_hook(
                    lambda _m, _i, out: weights.append(out.detach()[0].mean(0))
                )
            )
    try:
        out = model(torch.from_numpy(ids)[None], return_attn=True)
    finally:
        for h in hooks:
            h.remove()
    maps = [m[0].float().numpy() for m in (out.attn or [])]
    try:
        text = tokenizer.decode(ids.tolist())
    except Exception:  # a tokenizer that cannot decode a cut sequence: show ids instead
        text = " ".join(map(str, ids.tolist()))
    return AttentionProbe(
        maps=maps,
        head_weights=[w.numpy() for w in weights] if weights else None,
        text=text,
        virtual=cfg.model.virtual_heads.enabled,
    )
