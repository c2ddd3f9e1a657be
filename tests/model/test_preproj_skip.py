"""Pre-projection and content skip (SPEC 1.2, seed 000): their formulas by hand, the block's wiring
(sequential pre-LN, post-LN, parallel residual), exact equivalence to the baseline when W_down and
W_skip are zero, the per-layer Frobenius norm, and no extra K/V-cache bytes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.config import load_config
from attnlab.model import build_model
from attnlab.model.params import count
from tests.helpers.model import TINY, ids, perturb, slot_part

pytestmark = pytest.mark.usefixtures("float64")

# GPT-2 shape (sequential pre-LN, no biases, tied) and Pythia shape (parallel residual, biases,
# LayerNorm with bias, rotary on 25% of each head, untied)
GPT2 = ["model.bias=false", "model.norm.bias=false", "model.tie_embeddings=true"]
PYTHIA = [
    "model.residual_kind=parallel",
    "model.bias=true",
    "model.norm.bias=true",
    "model.tie_embeddings=false",
    "model.position.kind=rope",
    "model.position.rope_fraction=0.25",
]
SHAPES = {"gpt2": GPT2, "pythia": PYTHIA, "post_ln": [*GPT2, "model.norm_position=post"]}
METHOD = ["model.feature_map.kind=pre_projection", "model.side_branch.kind=content_skip"]


def tiny(*overrides: str):
    return load_config(None, [*TINY, *overrides]).model


# ------------------------------------------------------------------------------- the parts alone


@pytest.mark.parametrize("act", ["silu", "gelu"])
def test_pre_projection_matches_formula(act: str) -> None:
    cfg = tiny("model.feature_map.kind=pre_projection", f"model.feature_map.activation={act}")
    pp = slot_part(cfg, "feature_map")
    perturb(pp, 0.3)
    assert pp.w_up.weight.shape == (40, 32) and pp.w_down.weight.shape == (32, 40)  # e = 1.25
    x = torch.randn(3, 4, 32)
    a = F.silu if act == "silu" else F.gelu
    want = x + a(x @ pp.w_up.weight.T) @ pp.w_down.weight.T
    torch.testing.assert_close(pp(x), want, atol=1e-12, rtol=0)
    assert sum(p.numel() for p in pp.parameters()) == 2 * 40 * 32


def test_gated_pre_projection_matches_formula() -> None:
    cfg = tiny("model.feature_map.kind=pre_projection", "model.feature_map.gated=true")
    pp = slot_part(cfg, "feature_map")
    perturb(pp, 0.3)
    x = torch.randn(3, 4, 32)
    gate = F.silu(x @ pp.w_gate.weight.T)
    want = x + (gate * (x @ pp.w_up.weight.T)) @ pp.w_down.weight.T
    torch.testing.assert_close(pp(x), want, atol=1e-12, rtol=0)
    assert sum(p.numel() for p in pp.parameters()) == 3 * 40 * 32


def test_content_skip_is_w_skip_x_and_its_norm_is_frobenius() -> None:
    skip = slot_part(tiny("model.side_branch.kind=content_skip"), "side_branch")
    perturb(skip, 1.0)
    W = skip.w_skip.weight
    x = torch.randn(2, 5, 32)
    torch.testing.assert_close(skip(x), x @ W.T, atol=1e-12, rtol=0)
    fro = float(torch.linalg.matrix_norm(W.detach(), ord="fro"))
    assert skip.norm() == pytest.approx(fro, rel=1e-6)  # norm() reports in float32
    assert skip.norm() == pytest.approx(float(W.detach().pow(2).sum().sqrt()), rel=1e-6)
    assert skip.w_skip.bias is None


def test_init_is_near_identity_with_the_configured_stds() -> None:
    model = build_model(tiny(*METHOD, "model.d_model=64"))
    blk = model.decoder.blocks[0]
    for w, std in [
        (blk.feature_map.w_up.weight, 0.01),
        (blk.feature_map.w_down.weight, 0.01),
        (blk.side_branch.w_skip.weight, 1e-4),
    ]:
        assert float(w.detach().mean()).__abs__() < std / 5
        assert float(w.detach().std()) == pytest.approx(std, rel=0.1)
    # ... while ordinary linears keep init_std 0.02
    assert float(blk.attention.key.w_k.weight.detach().std()) == pytest.approx(0.02, rel=0.1)
    cfg = tiny(*METHOD, "model.feature_map.init_std=0.05", "model.side_branch.init_std=0")
    blk = build_model(cfg).decoder.blocks[0]
    assert float(blk.feature_map.w_up.weight.detach().std()) == pytest.approx(0.05, rel=0.15)
    assert torch.count_nonzero(blk.side_branch.w_skip.weight) == 0


# ------------------------------------------------------------------------------- the block wiring


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_block_wiring_by_hand(shape: str) -> None:
    model = build_model(tiny(*SHAPES[shape], *METHOD))
    perturb(model)
    blk = model.decoder.blocks[0]
    T = 6
    x = torch.randn(2, T, 32)
    ctx = model.decoder.context(T, 0, x.device, False)
    got, _ = blk(x, ctx)

    def attn(u: torch.Tensor) -> torch.Tensor:
        return blk.attention(u, ctx)[0]

    P, S = blk.feature_map, blk.side_branch
    if shape == "gpt2":
        xt = P(blk.norm1(x))
        h = x + attn(xt) + S(xt)
        want = h + blk.ffn(blk.norm2(h))
    elif shape == "pythia":
        xt = P(blk.norm1(x))
        want = x + attn(xt) + S(xt) + blk.ffn(blk.norm2(x))
    else:  # post-LN
        xt = P(x)
        h = blk.norm1(x + attn(xt) + S(xt))
        want = blk.norm2(h + blk.ffn(h))
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("gated", [False, True])
def test_zeroed_w_down_and_w_skip_reproduce_the_baseline_exactly(shape: str, gated: bool):
    base = build_model(tiny(*SHAPES[shape]))
    perturb(base)
    variant = build_model(tiny(*SHAPES[shape], *METHOD, f"model.feature_map.gated={gated}".lower()))
    missing, unexpected = variant.load_state_dict(base.state_dict(), strict=False)
    assert not unexpected
    assert missing and all(".feature_map." in k or ".side_branch." in k for k in missing)
    x = ids()
    before = variant(x).logits
    assert not torch.allclose(before, base(x).logits, atol=1e-9)  # the new parts do act
    with torch.no_grad():
        for blk in variant.decoder.blocks:
            blk.feature_map.w_down.weight.zero_()
            blk.side_branch.w_skip.weight.zero_()
    torch.testing.assert_close(variant(x).logits, base(x).logits, atol=0, rtol=0)


def test_content_skip_alone_and_pre_projection_alone_also_reduce_to_the_baseline() -> None:
    base = build_model(tiny(*PYTHIA))
    perturb(base)
    x = ids()
    for flag, zero in [
        ("model.side_branch.kind=content_skip", lambda b: b.side_branch.w_skip.weight),
        ("model.feature_map.kind=pre_projection", lambda b: b.feature_map.w_down.weight),
    ]:
        variant = build_model(tiny(*PYTHIA, flag))
        variant.load_state_dict(base.state_dict(), strict=False)
        with torch.no_grad():
            for blk in variant.decoder.blocks:
                zero(blk).zero_()
        torch.testing.assert_close(variant(x).logits, base(x).logits, atol=0, rtol=0)


# ----------------------------------------------------------------------------------- K/V cache


@pytest.mark.parametrize("shape", ["gpt2", "pythia"])
def test_pre_projection_and_skip_add_no_cache_bytes(shape: str) -> None:
    base = build_model(tiny(*SHAPES[shape]))
    variant = build_model(tiny(*SHAPES[shape], *METHOD))
    b = base.new_cache(3, 20, dtype=torch.float32).nbytes()
    assert variant.new_cache(3, 20, dtype=torch.float32).nbytes() == b
    assert b == 2 * 2 * 3 * 4 * 20 * 8 * 4  # K and V, L, B, H_kv, T, d_h, float32 bytes
    cb, cv = count(tiny(*SHAPES[shape])), count(tiny(*SHAPES[shape], *METHOD))
    assert cb.kv_cache_bytes_per_token == cv.kv_cache_bytes_per_token == 2 * 2 * 4 * 8 * 2
    # and the cached tensors have the baseline's shapes when decoding
    cache = variant.new_cache(2, 12, dtype=torch.float64)
    variant(ids(2, 5), cache=cache)
    assert all(k.shape == (2, 4, 12, 8) for k in cache.k + cache.v)
