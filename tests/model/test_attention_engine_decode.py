"""Cached decoding through the engine: the new rows (q_idx = start.., kv_idx = every cached key)
equal the full forward's rows, one token at a time and in chunks, for every causal mask, mod and
normaliser, on SDPA (a small mask or bias over the gathered keys) and on the explicit path."""

from __future__ import annotations

import random

import pytest
import torch

from attnlab.model.engine import AttentionEngine, AttentionSpec, EngineOptions, Sliding, T5Bias
from attnlab.model.engine.layout import build_layout
from tests.helpers.engine_reference import NORMALISERS, mod_sets
from tests.helpers.engine_reference import masks as all_masks


def _decode(engine, q, k, v, steps):
    """The rows of a cached decode: the prompt, then each chunk over the keys so far."""
    rows, start = [], 0
    for n in steps:
        end = start + n
        out, _ = engine(q[:, :, start:end], k[:, :, :end], v[:, :, :end], q_offset=start)
        rows.append(out)
        start = end
    return torch.cat(rows, 2)


@pytest.mark.parametrize("norm_i", range(len(NORMALISERS)))
@pytest.mark.parametrize("mask_i", range(6))
def test_cached_decoding_equals_the_full_forward(mask_i, norm_i):
    gen = random.Random(10 * mask_i + norm_i)
    T, H = 29, 4
    mask = all_masks(T, 1, True, gen)[mask_i]
    g = torch.Generator().manual_seed(mask_i)
    q = torch.randn(1, H, T, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, 2, T, 8, generator=g, dtype=torch.float64) for _ in range(2))
    sets = mod_sets(H, True)
    for mods in (sets[(mask_i + norm_i) % 5], sets[5]):  # one in turn, and all composed
        spec = AttentionSpec(mask, mods, NORMALISERS[norm_i])
        for path in ("auto", "block_sparse", "explicit"):
            if path == "block_sparse" and any(m.kind == "general" for m in mods):
                continue
            if path == "block_sparse" and NORMALISERS[norm_i].sdpa is None:
                continue
            eng = AttentionEngine(spec, EngineOptions(path=path, block_size=4))
            with torch.no_grad():
                full, _ = eng(q, k, v)
                steps = _decode(eng, q, k, v, [7, 1, 1, 1, 5, 4])
            assert (steps - full[:, :, :19]).abs().max() < 1e-10, (spec.line(), path)


def test_a_decode_step_runs_sdpa_over_the_window_only():
    """One new token with a sliding window and a T5 bias: block-sparse SDPA, gathering the
    window's blocks (not the whole cache), equal to its row of the full forward."""
    T, H, w = 300, 4, 16
    spec = AttentionSpec(Sliding(w), (T5Bias(H, 8, 32).double(),))
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, H, T, 8, generator=g, dtype=torch.float64) for _ in range(3))
    eng = AttentionEngine(spec, EngineOptions(block_size=16))
    with torch.no_grad():
        full, _ = eng(q, k, v)
        last, _ = eng(q[:, :, -1:], k, v, q_offset=T - 1)
    assert eng.last_plan.path == "block_sparse"
    assert (last - full[:, :, -1:]).abs().max() < 1e-10
    layout = build_layout(spec.mask, 1, T, T - 1, 16, 1, H, "cpu")
    assert layout.pairs <= w + 16
