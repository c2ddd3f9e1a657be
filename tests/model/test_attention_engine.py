"""The attention engine (issue 34): every path equals the float64 definition to 1e-10, forward
and gradients (w.r.t. q, k, v and a mod's own parameters), for every mask x mod x normaliser,
over random shapes (GQA, cross lengths, cached decoding at an offset, padding); the baseline is
bit-identical to today's SDPA call; the path choice and its one logged line."""

from __future__ import annotations

import logging
import random
import warnings

import pytest
import torch

from attnlab.base.errors import UserError
from attnlab.model.attention import AttentionCore
from attnlab.model.engine import (
    ALiBi,
    AttentionEngine,
    AttentionSpec,
    Causal,
    EngineOptions,
    FlexForm,
    Full,
    HeadScale,
    Normaliser,
    Sigmoid,
    Sliding,
    SoftCap,
    SoftmaxPlusOne,
    T5Bias,
)
from attnlab.model.engine.folds import fold
from attnlab.model.engine.normalisers import Softmax
from attnlab.model.engine.plan import Situation, choose
from attnlab.parts import ScoreContext
from tests.helpers.engine_reference import NORMALISERS, mod_sets, random_case, reference
from tests.helpers.engine_reference import masks as all_masks

TOL = 1e-10
GRAD_PATHS = ["sdpa", "block_sparse", "explicit"]


def _engine(spec, path, block, **kw):
    return AttentionEngine(spec, EngineOptions(path=path, block_size=block, **kw))


def _attend(engine, q, k, v, case, valid):
    try:
        return engine(q, k, v, scale=0.37, q_offset=case.q_offset, kv_valid=valid)[0]
    except UserError as e:  # a forced path that cannot run this call says so
        assert "cannot run this call" in str(e)
        return None


def _params(spec):
    return [p for m in spec.mods if isinstance(m, torch.nn.Module) for p in m.parameters()]


def _grads(out, inputs, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out.shape, generator=g, dtype=out.dtype)
    return torch.autograd.grad((out * w).sum(), inputs, allow_unused=True)


def _spec(case, seed, mask_i, mods_i, norm_i):
    gen = random.Random(seed)
    ms = all_masks(max(case.q_offset + case.Tq, case.Tk), case.B, case.causal, gen)
    mods = mod_sets(case.H, case.causal)[mods_i]
    return AttentionSpec(ms[mask_i % len(ms)], mods, NORMALISERS[norm_i])


def _check_paths(spec, case, seed):
    """Every path that can run the call equals the reference: forward and gradients (w.r.t.
    q, k, v and the mods' parameters) on the gradient paths, forward on eager flex."""
    q, k, v, valid = case.tensors(seed)
    inputs = [q, k, v, *_params(spec)]
    ref, _ = reference(q, k, v, spec, 0.37, case.q_offset, valid)
    want = _grads(ref, inputs, seed)
    ran = []
    for path in GRAD_PATHS:
        out = _attend(_engine(spec, path, case.block), q, k, v, case, valid)
        if out is None:
            continue
        ran.append(path)
        assert (out - ref).abs().max() < TOL, (path, spec.line(), case)
        for g, w in zip(_grads(out, inputs, seed), want):
            assert (g - w).abs().max() < TOL, (path, spec.line(), case)
    assert "explicit" in ran
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager flex warns that it is not compiled
        eng = _engine(spec, "flex", case.block, flex_compile=False, flex_cpu_inference=True)
        out = _attend(eng, q, k, v, case, valid)
    assert out is not None and (out - ref).abs().max() < TOL, ("flex", spec.line(), case)
    return ran


@pytest.mark.parametrize("mods_i", range(6))
@pytest.mark.parametrize("mask_i", range(6))
def test_every_mask_and_mod_on_every_path(mask_i, mods_i):
    """Each mask with each mod set (the normaliser in turn) on a random shape."""
    seed = 100 * mask_i + 10 * mods_i
    case = random_case(seed)
    _check_paths(_spec(case, seed, mask_i, mods_i, (mask_i + mods_i) % 3), case, seed)


@pytest.mark.parametrize("norm_i", range(len(NORMALISERS)))
@pytest.mark.parametrize("mask_i", range(6))
def test_every_normaliser_on_every_mask(mask_i, norm_i):
    """Each normaliser with each mask, under the composed mods (ALiBi, a learned gain, T5)."""
    seed = 5000 + 10 * mask_i + norm_i
    case = random_case(seed)
    _check_paths(_spec(case, seed, mask_i, 5, norm_i), case, seed)


@pytest.mark.parametrize("seed", range(12))
def test_auto_path_on_random_shapes(seed):
    """``auto`` with a composed spec on random shapes equals the definition."""
    case = random_case(1000 + seed)
    gen = random.Random(seed)
    ms = all_masks(max(case.q_offset + case.Tq, case.Tk), case.B, case.causal, gen)
    mods = gen.choice(mod_sets(case.H, case.causal))
    spec = AttentionSpec(gen.choice(ms), mods, gen.choice(NORMALISERS))
    q, k, v, valid = case.tensors(seed)
    inputs = [q, k, v, *_params(spec)]
    ref, _ = reference(q, k, v, spec, 0.37, case.q_offset, valid)
    out = _attend(_engine(spec, "auto", case.block), q, k, v, case, valid)
    assert (out - ref).abs().max() < TOL
    for g, w in zip(_grads(out, inputs, seed), _grads(ref, inputs, seed)):
        assert (g - w).abs().max() < TOL


@pytest.mark.parametrize("gqa", [False, True])
def test_the_baseline_is_bit_identical_to_todays_sdpa_call(gqa):
    """Causal, nothing declared: the engine's output and gradients are today's, bit for bit."""
    g = torch.Generator().manual_seed(0)
    B, H, T, d = 2, 4, 64, 16
    Hkv = 2 if gqa else H
    q = torch.randn(B, H, T, d, generator=g, requires_grad=True)
    k = torch.randn(B, Hkv, T, d, generator=g, requires_grad=True)
    v = torch.randn(B, Hkv, T, d, generator=g, requires_grad=True)
    core = AttentionCore(d)
    old = core.sdpa(q, k, v, ScoreContext(None, True))
    eng = AttentionEngine(AttentionSpec(Causal()))
    new, _ = eng(q, k, v, scale=core.scale)
    assert eng.last_plan.path == "sdpa" and torch.equal(old, new)
    w = torch.randn(old.shape, generator=g)
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            torch.autograd.grad((old * w).sum(), [q, k, v]),
            torch.autograd.grad((new * w).sum(), [q, k, v]),
        )
    )
    # one-token decoding over a cache: no mask, as today's context gives it
    old1 = core.sdpa(q[:, :, -1:], k, v, ScoreContext(None, False))
    new1, _ = eng(q[:, :, -1:], k, v, scale=core.scale, q_offset=T - 1)
    assert torch.equal(old1, new1)


def _plan(mods=(), normaliser=None, device="cpu", grad=True, dense="causal", weights=False, **kw):
    s = Situation(device, grad, weights, dense, 0.0, kw.pop("flex_cpu", False))
    return choose(fold(mods), normaliser or Softmax(), s, **kw)


def test_the_path_choice():
    """Each idea lands on the path the issue orders, with its reason."""
    H = 4
    assert _plan().path == "sdpa"
    assert _plan((HeadScale(H), ALiBi(H))).path == "sdpa"
    assert _plan((T5Bias(H),)).path == "block_sparse"  # a float bias over gathered blocks
    assert _plan(dense=None).path == "block_sparse"  # a window, documents, padding
    p = _plan((SoftCap(5.0),))
    assert p.path == "explicit" and "flex has no backward on CPU" in p.reason
    assert _plan((SoftCap(5.0),), grad=False, flex_cpu=True).path == "flex"
    assert _plan((SoftCap(5.0),), device="cuda").path == "flex"
    assert _plan(dense=None, device="cuda").path == "flex"
    assert _plan(device="cuda").path == "sdpa"  # nothing declared: plain SDPA on CUDA too
    assert _plan(normaliser=Sigmoid(-3.0)).path == "explicit"
    assert _plan(normaliser=Sigmoid(-3.0), device="cuda").path == "flex"
    assert _plan(normaliser=SoftmaxPlusOne()).path == "block_sparse"  # a sink key
    assert _plan(weights=True).path == "explicit"


def test_a_forced_path_that_cannot_run_says_why():
    with pytest.raises(UserError, match="flex has no backward on CPU"):
        _plan(forced="flex")
    with pytest.raises(UserError, match="SoftCap has no SDPA form"):
        _plan((SoftCap(1.0),), forced="block_sparse")
    with pytest.raises(UserError, match="not one of"):
        _plan(forced="fast")


def test_the_path_is_logged_once_per_configuration(caplog):
    q = k = v = torch.randn(1, 2, 16, 8)
    eng = _engine(AttentionSpec(Sliding(5), (HeadScale(2, learned=False),)), "auto", 4)
    with caplog.at_level(logging.INFO, logger="attnlab.attention"):
        for _ in range(3):
            eng(q, k, v)
    lines = [r.getMessage() for r in caplog.records if r.name == "attnlab.attention"]
    assert len(lines) == 1
    assert lines[0].startswith("attention path block_sparse: the mask is not SDPA's own")
    assert "Sliding(window=5, causal=True)" in lines[0]


def test_need_weights_returns_the_definitions_weights():
    case = random_case(7)
    q, k, v, valid = case.tensors(7, grad=False)
    spec = AttentionSpec(Causal() if case.causal else Full(), (ALiBi(case.H, case.causal),))
    ref_out, ref_w = reference(q, k, v, spec, 0.37, case.q_offset, valid)
    out, w = AttentionEngine(spec)(
        q, k, v, scale=0.37, q_offset=case.q_offset, kv_valid=valid, need_weights=True
    )
    assert (out - ref_out).abs().max() < TOL and (w - ref_w).abs().max() < TOL


def test_alibi_fold_is_refused_in_half_precision_and_when_it_would_round():
    """bfloat16: ALiBi runs as a float bias (positions above 256 would round in a column); a
    long float32 call whose one-call fold would round more than the tolerance is centred per
    block instead, and still equals the float64 definition closely."""
    g = torch.Generator().manual_seed(0)
    H, T, d = 4, 512, 16
    spec = AttentionSpec(Causal(), (ALiBi(H),))
    q, k, v = (torch.randn(1, H, T, d, generator=g) for _ in range(3))
    ref, _ = reference(q.double(), k.double(), v.double(), spec, 0.25)
    eng = AttentionEngine(spec, EngineOptions(fold_tolerance=1e-9))
    out, _ = eng(q, k, v, scale=0.25)
    assert eng.last_plan.path == "block_sparse" and "would round" in eng.last_plan.reason
    assert (out.double() - ref).abs().max() < 1e-5
    out16, _ = AttentionEngine(spec)(q.bfloat16(), k.bfloat16(), v.bfloat16(), scale=0.25)
    assert (out16.double() - ref).abs().max() < 0.05  # bf16 inputs, bias not rounded to bf16 ulps


def test_bad_shapes_are_user_errors():
    eng = AttentionEngine(AttentionSpec())
    q = torch.randn(1, 3, 4, 8)
    with pytest.raises(UserError, match="must divide"):
        eng(q, torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8))
    with pytest.raises(UserError, match="do not match"):
        eng(q, torch.randn(1, 3, 4, 4), torch.randn(1, 3, 4, 8))
    with pytest.raises(UserError, match="kv_valid"):
        eng(q, q, q, kv_valid=torch.ones(2, 4, dtype=torch.bool))


def test_stacks_cut_into_pieces_still_equal_the_definition(monkeypatch):
    """A stack over MAX_PAIRS pairs runs as consecutive pieces (bounded masks and biases)."""
    from attnlab.model.engine import layout

    case = random_case(3)
    for mods_i in (0, 5):
        spec = _spec(case, 3, 0, mods_i, 1)
        mask = spec.mask.fit(case.q_offset + case.Tq, case.Tk, "cpu")
        shape = (case.Tq, case.Tk, case.q_offset, 4, case.B, case.H, "cpu")
        whole = layout.build_layout(mask, *shape)
        monkeypatch.setattr(layout, "MAX_PAIRS", 40)
        cut = layout.build_layout(mask, *shape)
        assert len(cut.stacks) > len(whole.stacks) and cut.pairs == whole.pairs
        assert all(st.q_idx.shape[0] == 1 or st.pairs <= 40 for st in cut.stacks)
        case.block = 4
        _check_paths(spec, case, 3)
        monkeypatch.undo()


class _ShiftedSigmoid(Normaliser):
    """A plugin normaliser as docs/attention-engine.md shows one: weights, and a flex form."""

    name = "shifted_sigmoid"

    def weights(self, scores, allowed):
        return torch.sigmoid(scores - 1.0) * allowed

    def flex(self):
        return FlexForm(
            lambda s, b, h, q, kv: torch.nn.functional.logsigmoid(s - 1.0),
            lambda out, lse: out * lse.exp()[..., None],
        )


def test_a_plugin_normaliser_runs_explicit_and_through_its_flex_form():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 24, 8, generator=g, dtype=torch.float64) for _ in range(3))
    spec = AttentionSpec(Sliding(6), (ALiBi(2),), _ShiftedSigmoid())
    i, j = torch.arange(24)[:, None], torch.arange(24)[None, :]
    allowed = (i - j >= 0) & (i - j < 6)
    s = (q @ k.transpose(-1, -2)) * 0.3 + ALiBi(2).slopes.double()[:, None, None] * (j - i)
    want = (torch.sigmoid(s - 1.0) * allowed) @ v
    eng = AttentionEngine(spec)
    out, _ = eng(q, k, v, scale=0.3)
    assert eng.last_plan.path == "explicit" and (out - want).abs().max() < TOL
    flex = _engine(spec, "flex", 8, flex_compile=False, flex_cpu_inference=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, _ = flex(q, k, v, scale=0.3)
        first = next(iter(flex._block_masks.entries.values()))
        flex(q, k, v, scale=0.3)  # the same shape: the cached block mask
    assert (out - want).abs().max() < TOL
    assert len(flex._block_masks.entries) == 1
    assert next(iter(flex._block_masks.entries.values())) is first
