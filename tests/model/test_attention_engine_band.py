"""The band path (``model/engine/band.py``): a causal bias that is one value per head beyond D
keys (T5's buckets) runs as is_causal SDPA over the far keys plus a float bias over the band,
merged by log-sum-exp. Proven against the float64 definition (forward and the gradients of q, k,
v and the bias table) on random shapes, through the battery's ``fused`` property in a model,
and the declaration itself (``T5Bias.band``) against the bucket function."""

from __future__ import annotations

import random

import pytest
import torch

from attnlab.model.engine import (
    AttentionEngine,
    AttentionSpec,
    Causal,
    HeadScale,
    Sliding,
    T5Bias,
)
from attnlab.model.engine import engine as engine_module
from attnlab.model.engine.band import band_bias, banded_bias
from attnlab.testing import check_part
from tests.helpers.engine_reference import reference

TOL = 1e-10


def _t5(H: int, buckets: int, max_distance: int) -> T5Bias:
    t5 = T5Bias(H, buckets=buckets, max_distance=max_distance).double()
    torch.nn.init.normal_(t5.table.weight)
    return t5


def _tensors(B, H, Hkv, T, d, seed):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(B, h, T, d, generator=g, dtype=torch.float64).requires_grad_(True)
        for h in (H, Hkv, Hkv)
    ]


def _grads(out, inputs, seed):
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    return torch.autograd.grad((out * w).sum(), inputs)


@pytest.mark.fast
@pytest.mark.parametrize("seed", range(8))
def test_the_band_path_equals_the_definition(seed):
    """Random B, heads (GQA), lengths (a multiple of D or not, just past D, many blocks) and
    bucket settings: output and gradients (q, k, v, the table) to 1e-10 in float64."""
    gen = random.Random(seed)
    Hkv = gen.choice([1, 2])
    H = Hkv * gen.choice([1, 2])
    buckets = gen.choice([4, 8])
    D = gen.choice([buckets // 2 + 1, buckets, 2 * buckets])
    T = gen.choice([D + 1, 2 * D, 3 * D + gen.randrange(1, D), 7 * D - 1])
    t5 = _t5(H, buckets, D)
    spec = AttentionSpec(Causal(), (t5,))
    q, k, v = _tensors(gen.choice([1, 2]), H, Hkv, T, gen.choice([3, 8]), seed)
    engine = AttentionEngine(spec)
    out, _ = engine(q, k, v, scale=0.37)
    assert engine.last_plan.reason.startswith("mask is causal, T5Bias is one value per head")
    assert f"beyond {D} keys" in engine.last_plan.reason
    ref, _ = reference(q, k, v, spec, 0.37)
    assert (out - ref).abs().max() < TOL
    inputs = [q, k, v, t5.table.weight]
    want = _grads(ref, inputs, seed)
    for got, w in zip(_grads(out, inputs, seed), want):
        assert (got - w).abs().max() < TOL
    for rows in [r for r in (D // 2, D // 4) if r and D % r == 0]:  # smaller query blocks
        make = lambda n: band_bias(t5.bias, H, D, n, "cpu", torch.float64)  # noqa: E731
        out = banded_bias(q, k, v, 0.37, D, make, [t5.table.weight], rows)
        assert (out - ref).abs().max() < TOL, rows
        for got, w in zip(_grads(out, inputs, seed), want):
            assert (got - w).abs().max() < TOL, rows


@pytest.mark.fast
def test_the_band_path_without_grad_and_in_float32():
    """Inference (no graph) takes the band too; float32 stays within float32 rounding."""
    t5 = T5Bias(4, buckets=8, max_distance=16)
    torch.nn.init.normal_(t5.table.weight)
    spec = AttentionSpec(Causal(), (t5,))
    q, k, v = (t.detach().float() for t in _tensors(2, 4, 2, 75, 16, 0))
    engine = AttentionEngine(spec)
    with torch.no_grad():
        out, _ = engine(q, k, v)
    assert "beyond 16 keys" in engine.last_plan.reason
    ref, _ = reference(q.double(), k.double(), v.double(), spec, 0.25)
    assert (out.double() - ref).abs().max() < 1e-5


@pytest.mark.fast
def test_calls_the_band_cannot_run_keep_the_gathered_path():
    """A gain besides the bias, a window, decoding at an offset, half precision and a sequence
    no longer than the band take the block-sparse path with a float bias, unchanged."""
    t5 = _t5(2, 8, 8)
    q, k, v = _tensors(1, 2, 2, 20, 8, 1)
    cases = [
        (AttentionSpec(Causal(), (t5, HeadScale(2).double())), (q, k, v), {}),
        (AttentionSpec(Sliding(12), (t5,)), (q, k, v), {}),
        (AttentionSpec(Causal(), (t5,)), (q[:, :, -4:], k, v), {"q_offset": 16}),
        (AttentionSpec(Causal(), (t5,)), (q[:, :, :8], k[:, :, :8], v[:, :, :8]), {}),
        (
            AttentionSpec(Causal(), (T5Bias(2, 8, 8),)),
            (q.bfloat16(), k.bfloat16(), v.bfloat16()),
            {},
        ),
    ]
    for spec, (a, b, c), kw in cases:
        engine = AttentionEngine(spec)
        engine(a, b, c, **kw)
        assert "beyond" not in engine.last_plan.reason, spec.line()


@pytest.mark.fast
@pytest.mark.parametrize(("buckets", "max_distance"), [(32, 128), (8, 16), (16, 20), (4, 3)])
def test_t5_declares_its_band_truthfully(buckets, max_distance):
    """Every distance >= band() falls in one bucket (the bias is one value per head there);
    bidirectional T5 and a max_distance inside the exact buckets declare none."""
    t5 = T5Bias(2, buckets=buckets, max_distance=max_distance)
    assert T5Bias(2, buckets, max_distance, bidirectional=True).band() is None
    D = t5.band()
    if max_distance <= buckets // 2:
        assert D is None
        return
    far = t5.bucket(-torch.arange(D, 50 * D))
    assert (far == far[0]).all() and int(far[0]) == buckets - 1


def test_t5_in_a_model_is_proven_fused_on_the_band(monkeypatch):
    """The battery's ``fused`` property (float64, 1e-10, logits and every gradient) on a T5
    whose band (4 keys) is shorter than the battery's sequence, so the band path runs."""
    calls = []
    real = engine_module.run_banded

    def spy(*args):
        calls.append(args[-1])
        return real(*args)

    monkeypatch.setattr(engine_module, "run_banded", spy)
    report = check_part(
        "position",
        "t5",
        buckets=4,
        max_distance=4,
        compile=False,
        export=False,
        properties=["fused", "kv_cache"],
    )
    report.assert_passed()
    assert calls and set(calls) == {4}
