"""What a trained run's weights say, read from its final checkpoint, through the parts' own
declarations (nothing here names a part):

- layer statistics: every part's ``layer_stats()`` per layer (the content skip declares
  ``||W_skip||_F``, seed 000's Figure 2);
- attention maps: the per-layer probabilities ``[H, T, T]`` on one fixed validation sequence (the
  first ``T`` tokens of the validation split, the same for every run of a data directory), with
  every part's ``forward_stats()`` of that forward (the identity head declares its mean head
  weights over the ``H + 1`` heads).

Each costs one forward pass of a single sequence on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from attnlab.parts import Part


def _blocks(model) -> list:
    stack = model.decoder if model.decoder is not None else model.encoder
    return list(stack.blocks)


def _parts(block) -> list[Part]:
    return [m for m in block.modules() if isinstance(m, Part)]


def layer_stats(run_dir: str | Path) -> dict[str, list[float]]:
    """stat name -> one value per layer, from the final checkpoint's parts ({} if none)."""
    from attnlab.runs.load import load_run_model

    model, _, _ = load_run_model(run_dir)
    out: dict[str, list[float]] = {}
    for block in _blocks(model):
        for part in _parts(block):
            for key, value in part.layer_stats().items():
                out.setdefault(key, []).append(float(value))
    return out


@dataclass
class AttentionProbe:
    """Attention maps and the parts' recorded forward statistics of one run on one sequence."""

    maps: list[np.ndarray]  # per layer (per loop slot), [H, T, T]
    text: str  # the sequence, decoded
    virtual: bool  # the maps are of heads a score part made
    #: stat name -> one array per layer (e.g. "head_weights": [H + 1] mean over tokens)
    forward_stats: dict[str, list[np.ndarray]] = field(default_factory=dict)
    #: stat name -> (a sentence for the report, trailing bar labels)
    docs: dict[str, tuple[str, list[str] | None]] = field(default_factory=dict)


def probe_sequence(data_dir: str | Path, n_tokens: int) -> np.ndarray:
    """The first ``n_tokens`` tokens of the validation split (a fixed sequence)."""
    from attnlab.data import TokenData

    data = TokenData.open(Path(data_dir))
    return np.asarray(data.val[:n_tokens], dtype=np.int64)


@torch.no_grad()
def attention_probe(run_dir: str | Path, n_tokens: int = 48) -> AttentionProbe:
    """Run the final checkpoint on the fixed validation sequence with ``return_attn=True``,
    recording every part's forward statistics."""
    from attnlab.runs.load import load_run_model

    model, cfg, tokenizer = load_run_model(run_dir)
    n = min(n_tokens, cfg.data.seq_len, cfg.model.max_seq_len)
    ids = probe_sequence(cfg.data.dir, n)
    per_layer = [_parts(b) for b in _blocks(model)]
    for parts in per_layer:
        for p in parts:
            p.record(True)
    try:
        out = model(torch.from_numpy(ids)[None], return_attn=True)
        stats: dict[str, list[np.ndarray]] = {}
        docs: dict[str, tuple[str, list[str] | None]] = {}
        for parts in per_layer:
            for p in parts:
                for key, value in p.forward_stats().items():
                    stats.setdefault(key, []).append(value.float().numpy())
                    docs.update({k: d for k, d in type(p).forward_stats_doc().items() if k == key})
    finally:
        for parts in per_layer:
            for p in parts:
                p.record(False)
    maps = [m[0].float().numpy() for m in (out.attn or [])]
    try:
        text = tokenizer.decode(ids.tolist())
    except Exception:  # a tokenizer that cannot decode a cut sequence: show ids instead
        text = " ".join(map(str, ids.tolist()))
    return AttentionProbe(
        maps=maps,
        text=text,
        virtual=any(p.slot == "score" for parts in per_layer for p in parts),
        forward_stats=stats,
        docs=docs,
    )
