"""The centred path (``model/engine/centred.py``): ALiBi's folded columns past the length one
call may fold run as fused SDPA per group of rows, each centred on its own, the groups' far and
diagonal keys merged by log-sum-exp. Proven against the float64 definition, forward and the
gradients of q, k, v and a learned gain before the bias; calls it cannot run keep the
block-sparse path."""

from __future__ import annotations

import random

import pytest
import torch

from attnlab.model.engine import (
    ALiBi,
    AttentionEngine,
    AttentionSpec,
    Causal,
    EngineOptions,
    HeadScale,
    Sliding,
    centred,
)
from attnlab.model.positions import alibi_slopes
from tests.helpers.engine_reference import reference

TOL = 1e-10
GROUP = 8


@pytest.fixture(autouse=True)
def small_groups(monkeypatch):
    monkeypatch.setattr(centred, "MIN_GROUP", GROUP)


def _tolerance(H: int) -> float:
    """A fold_tolerance that folds a group of GROUP rows in float64 but not 2 GROUP (the
    estimate is m_max |i - c| + 1 times eps / 2)."""
    m = float(alibi_slopes(H).max())
    return (m * GROUP * 3 / 4 + 1) * torch.finfo(torch.float64).eps / 2


def _gain(H: int) -> HeadScale:
    g = HeadScale(H).double()
    with torch.no_grad():
        g.gain.uniform_(0.5, 1.5)
    return g


@pytest.mark.fast
@pytest.mark.parametrize("seed", range(6))
def test_the_centred_path_equals_the_definition(seed):
    gen = random.Random(seed)
    Hkv = gen.choice([2, 4])
    H = Hkv * gen.choice([1, 2])
    T = gen.choice([2 * GROUP + 1, 3 * GROUP, 5 * GROUP + gen.randrange(1, GROUP)])
    gain = _gain(H) if seed % 2 else None
    spec = AttentionSpec(Causal(), (ALiBi(H),) if gain is None else (gain, ALiBi(H)))
    g, B = torch.Generator().manual_seed(seed), gen.choice([1, 2])
    q, k, v = (
        torch.randn(B, h, T, 6, generator=g, dtype=torch.float64).requires_grad_(True)
        for h in (H, Hkv, Hkv)
    )
    engine = AttentionEngine(spec, EngineOptions(fold_tolerance=_tolerance(H)))
    out, _ = engine(q, k, v, scale=0.37)
    assert engine.last_plan.path == "sdpa"
    assert f"per group of {GROUP} rows" in engine.last_plan.reason
    ref, _ = reference(q, k, v, spec, 0.37)
    assert (out - ref).abs().max() < TOL
    inputs = [q, k, v] + ([gain.gain] if gain is not None else [])
    w = torch.randn(ref.shape, generator=g, dtype=ref.dtype)
    got = torch.autograd.grad((out * w).sum(), inputs)
    want = torch.autograd.grad((ref * w).sum(), inputs)
    for a, b in zip(got, want):
        assert (a - b).abs().max() < TOL


@pytest.mark.fast
def test_calls_it_cannot_run_keep_the_block_sparse_path():
    """A gain after the bias (it multiplies the columns) and a window keep per-block
    centring on the block-sparse path; both still equal the definition."""
    H, T = 4, 3 * GROUP
    q, k, v = (torch.randn(1, H, T, 6, dtype=torch.float64) for _ in range(3))
    for spec in (
        AttentionSpec(Causal(), (ALiBi(H), _gain(H))),
        AttentionSpec(Sliding(2 * GROUP), (ALiBi(H),)),
    ):
        engine = AttentionEngine(spec, EngineOptions(fold_tolerance=_tolerance(H)))
        out, _ = engine(q, k, v, scale=0.37)
        assert engine.last_plan.path == "block_sparse", spec.line()
        assert (out - reference(q, k, v, spec, 0.37)[0]).abs().max() < TOL
