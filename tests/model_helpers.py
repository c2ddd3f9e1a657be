"""Shared helpers of the model tests: a tiny config and exact float64 arithmetic."""

from __future__ import annotations

import pytest
import torch

from attnlab.config import ModelConfig, load_config

TINY = [
    "model.d_model=32",
    "model.n_layers=2",
    "model.attention.n_heads=4",
    "model.vocab_size=64",
    "model.max_seq_len=32",
    "data.seq_len=16",
]


def tiny(*overrides: str) -> ModelConfig:
    """A 2-layer, 32-wide model config with the given ``--set`` overrides."""
    return load_config(None, [*TINY, *overrides]).model


def perturbed(*flags: str):
    """The model of ``tiny(*flags)`` in eval mode with every weight moved off its init by
    N(0, 0.1), so parts that start as identities or zeros really take part."""
    from attnlab.model import build_model

    model = build_model(tiny(*flags))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def bump(ids: torch.Tensor, t: int, vocab: int = 64) -> torch.Tensor:
    """``ids`` with the token at position ``t`` changed (to probe what position t influences)."""
    out = ids.clone()
    out[:, t] = (out[:, t] + 7) % vocab
    return out


@pytest.fixture(autouse=True)
def _float64():
    """Every test of a module importing this runs in float64, one thread, seed 0."""
    old, threads = torch.get_default_dtype(), torch.get_num_threads()
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield
    torch.set_default_dtype(old)
    torch.set_num_threads(threads)
