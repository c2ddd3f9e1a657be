"""The engine's masks: the same pairs as today's ``model/masks.py`` (BigBird's seeded random blocks
included), hints that never under-cover, layouts that cover every allowed pair and whose work
grows with T w for a window (not T^2), and a mask written outside attnlab (examples/)."""

from __future__ import annotations

import importlib.util
import random
import warnings

import pytest
import torch

from attnlab.model.engine import (
    AttentionEngine,
    AttentionSpec,
    BigBird,
    Causal,
    Document,
    EngineOptions,
    Full,
    LocalGlobal,
    Prefix,
    Sliding,
)
from attnlab.model.engine.layout import build_layout, evaluate_block_map
from attnlab.model.masks import dense_allowed, reference_pairs
from tests.helpers.engine_reference import masks as all_masks
from tests.helpers.engine_reference import random_case, reference
from tests.helpers.model import make_part
from tests.helpers.paths import EXAMPLES


def _dense(mask, q_pos, k_pos, B=1):
    """[B, Tq, Tk] bool: the engine mask's mask_mod on the grid."""
    b = torch.arange(B)[:, None, None]
    return mask.mask_mod(b, torch.tensor(0), q_pos[None, :, None], k_pos[None, None, :]).expand(
        B, len(q_pos), len(k_pos)
    )


CONFIGS = [
    (dict(mask="causal"), lambda c: Causal() if c else Full()),
    (dict(mask="prefix", prefix_len=5), lambda c: Prefix(5) if c else Full()),
    (dict(mask="sliding", window=4), lambda c: Sliding(4, c)),
    (dict(mask="local_global", window=3, n_global=2, global_every=7), None),
    (
        dict(mask="bigbird", window=3, n_global=1, global_every=0, block_size=4, random_blocks=2),
        None,
    ),
    (
        dict(mask="bigbird", window=2, n_global=0, global_every=5, block_size=3, random_blocks=1),
        None,
    ),
]


def _engine_mask(opts: dict, make, causal: bool):
    if make is not None:
        return make(causal)
    if opts["mask"] == "local_global":
        return LocalGlobal(opts["window"], opts["n_global"], opts["global_every"], causal)
    return BigBird(
        opts["window"],
        opts["n_global"],
        opts["global_every"],
        opts["block_size"],
        opts["random_blocks"],
        seed=17,
        causal=causal,
    )


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("i", range(len(CONFIGS)))
def test_the_masks_are_model_masks_pairs(i, causal):
    """Every pair, at several lengths and for the cached-decoding rows (queries at an offset)."""
    opts, make = CONFIGS[i]
    if not causal and opts["mask"] == "prefix":
        pytest.skip("a bidirectional stack's prefix mask is the full one (covered by causal)")
    options = {k: v for k, v in opts.items() if k != "mask"}
    seeded = {"random_seed": 17} if opts["mask"] == "bigbird" else {}
    mask = _engine_mask(opts, make, causal)
    part = make_part("mask", opts["mask"], **options, **seeded)(causal)  # the mask slot's part
    for T, start in [(37, 0), (64, 0), (50, 49), (50, 40)]:
        q_pos, k_pos = torch.arange(start, T), torch.arange(T)
        want = reference_pairs(q_pos, k_pos, causal, **options, random_seed=17)
        got = _dense(mask.fit(T, T, "cpu"), q_pos, k_pos)[0]
        assert torch.equal(got, want), (opts, causal, T, start)
        assert torch.equal(dense_allowed(part, q_pos, k_pos), want), (opts, causal, T, start)


def test_the_document_mask_keeps_packed_documents_apart():
    docs = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2], [0, 1, 1, 1, 1, 1, 2, 2]])
    i, j = torch.arange(8)[:, None], torch.arange(8)[None, :]
    for causal in (True, False):
        got = _dense(Document(docs, causal), torch.arange(8), torch.arange(8), B=2)
        for b in range(2):
            want = docs[b][:, None] == docs[b][None, :]
            assert torch.equal(got[b], want & (j <= i) if causal else want)


@pytest.mark.parametrize("seed", range(10))
def test_hints_never_under_cover_and_layouts_cover_every_pair(seed):
    """The declared block map holds every block mask_mod allows, and every allowed pair of
    every row is gathered by the stack that owns the row (the last one holding it)."""
    case = random_case(2000 + seed)
    Tq, Tk, off = case.Tq, case.Tk, case.q_offset
    gen = random.Random(seed)
    for mask in all_masks(max(off + Tq, Tk), case.B, case.causal, gen):
        mask = mask.fit(off + Tq, Tk, "cpu")
        block = gen.choice([1, 2, 3, 8])
        starts = torch.arange(0, Tq, block)
        lo, hi = off + starts, off + (starts + block).clamp_max(Tq) - 1
        k_lo = torch.arange(0, Tk, block)
        k_hi = (k_lo + block).clamp_max(Tk) - 1
        declared = mask.block_map(lo, hi, k_lo, k_hi)
        evaluated = evaluate_block_map(mask, lo, hi, Tk, block, case.B, case.H)
        gk = mask.global_keys(Tk, "cpu")
        gq = mask.global_queries(off, Tq, "cpu")
        if declared is not None and gk is None and gq is None:
            assert not (evaluated & ~declared).any(), mask
        allowed = _dense(mask, off + torch.arange(Tq), torch.arange(Tk), case.B).any(0)
        layout = build_layout(mask, Tq, Tk, off, block, case.B, case.H, "cpu")
        owner_keys = {}
        for st in layout.stacks:
            for rows, keys, real in zip(st.q_idx, st.kv_idx, st.kv_real):
                for r in rows.tolist():
                    owner_keys[r] = set(keys[real].tolist())
        for r in range(Tq):
            want = set(allowed[r].nonzero().flatten().tolist())
            assert want <= owner_keys.get(r, set()), (mask, r)


def test_a_window_layout_grows_with_t_w_not_t_squared():
    """Pairs a sliding window's layout computes: about T (w + block), far below T^2 / 2."""
    w, block = 64, 64
    for T in (1024, 4096):
        layout = build_layout(Sliding(w), T, T, 0, block, 1, 1, "cpu")
        assert layout.pairs <= T * (w + 2 * block)
        assert layout.pairs < T * T / 8
    lg = LocalGlobal(64, n_global=4, global_every=512).fit(4096, 4096, "cpu")
    pairs = build_layout(lg, 4096, 4096, 0, 64, 1, 1, "cpu").pairs
    assert pairs < 4096 * (64 + 128 + 8 + 8) + 8 * 4096  # window blocks, globals, global rows


def _example():
    spec = importlib.util.spec_from_file_location("dilated_window", EXAMPLES / "dilated_window.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.DilatedWindow


def test_a_mask_from_outside_attnlab_runs_on_every_path():
    """examples/dilated_window.py: its mask_mod and hints alone give the definition's result on
    the block-sparse, explicit and eager flex paths, and a sparse layout."""
    DilatedWindow = _example()
    mask = DilatedWindow(4, 3)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 40, 8, generator=g, dtype=torch.float64) for _ in range(3))
    spec = AttentionSpec(mask)
    ref, _ = reference(q, k, v, spec, 0.35)
    for path, kw in [
        ("auto", {}),
        ("explicit", {}),
        ("flex", dict(flex_compile=False, flex_cpu_inference=True)),
    ]:
        eng = AttentionEngine(spec, EngineOptions(path=path, block_size=8, **kw))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # eager flex warns that it is not compiled
            out, _ = eng(q, k, v, scale=0.35)
        assert (out - ref).abs().max() < 1e-10, path
    assert eng.last_plan.path == "flex"
    assert build_layout(mask, 512, 512, 0, 8, 1, 1, "cpu").pairs < 512 * 32
