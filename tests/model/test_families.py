"""The three families and the universal (looped) stack: the encoder is bidirectional, the
encoder-decoder's cross-attention reads the encoder while its decoder stays causal, and looping
shares one block's weights (params independent of the loop count)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.config import load_config
from attnlab.model import build_model
from attnlab.model.params import count
from attnlab.model.positions import SinusoidalPositions
from tests.helpers.model import TINY, bump, perturbed

pytestmark = pytest.mark.usefixtures("float64")

ENCODER = ["model.family=encoder", "model.mask.kind=full"]
ENC_DEC = ["model.family=encoder_decoder", "model.n_decoder_layers=3"]


def changed(a: torch.Tensor, b: torch.Tensor) -> list[bool]:
    """Per position (dim 1): does any entry differ?"""
    return ((a - b).abs().flatten(2).amax(-1) > 1e-12).any(0).tolist()


# -------------------------------------------------------------------------------------- encoder


@pytest.mark.parametrize("position", ["learned", "rope", "alibi", "t5"])
def test_encoder_is_bidirectional(position: str) -> None:
    model = perturbed(*ENCODER, f"model.position.kind={position}")
    assert not model.supports_cache
    ids = torch.randint(0, 64, (2, 8))
    base = model(ids).logits
    assert all(changed(model(bump(ids, 7)).logits, base))  # the last token reaches the first
    assert all(changed(model(bump(ids, 0)).logits, base))


def test_encoder_sliding_window_is_symmetric() -> None:
    model = perturbed(
        *ENCODER[:1], "model.n_layers=1", "model.mask.kind=sliding", "model.mask.window=2"
    )
    ids = torch.randint(0, 64, (1, 9))
    base = model(ids).logits
    for j in range(9):
        reach = changed(model(bump(ids, j)).logits, base)
        assert reach == [abs(i - j) < 2 for i in range(9)], j


def test_encoder_has_no_cache() -> None:
    model = perturbed(*ENCODER)
    with pytest.raises(ValueError, match="encoder-only"):
        model.new_cache(1, 4)


def test_masked_lm_loss_ignores_minus_100() -> None:
    model = perturbed(*ENCODER)
    ids = torch.randint(0, 64, (2, 8))
    targets = torch.full_like(ids, -100)
    targets[0, 2], targets[1, 5], targets[1, 6] = 3, 9, 11
    out = model(ids, targets=targets)
    logits = out.logits
    want = F.cross_entropy(
        torch.stack([logits[0, 2], logits[1, 5], logits[1, 6]]), torch.tensor([3, 9, 11])
    )
    # the loss is computed in float32 (logits.float()), whatever the model's dtype
    torch.testing.assert_close(out.loss.double(), want, atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------ encoder-decoder


@pytest.mark.parametrize("mask", ["causal", "full"])
@pytest.mark.parametrize("position", ["learned", "t5", "rope"])
def test_encoder_decoder_directions_and_cross_attention(mask: str, position: str) -> None:
    model = perturbed(*ENC_DEC, f"model.mask.kind={mask}", f"model.position.kind={position}")
    assert len(model.encoder.blocks) == 2 and len(model.decoder.blocks) == 3
    enc, dec = torch.randint(0, 64, (2, 7)), torch.randint(0, 64, (2, 6))
    # the encoder is bidirectional whatever the mask names
    h = model.encode(enc)
    assert all(changed(model.encode(bump(enc, 6)), h))
    base = model(dec, encoder_input_ids=enc).logits
    # cross-attention reads every encoder token, from every decoder position
    for j in (0, 6):
        assert all(changed(model(dec, encoder_input_ids=bump(enc, j)).logits, base))
    # the decoder is causal in its own input
    for t in (2, 5):
        assert changed(model(bump(dec, t), encoder_input_ids=enc).logits, base) == [
            i >= t for i in range(6)
        ]


@pytest.mark.fast
def test_encoder_decoder_memory_argument_equals_encoding_inside() -> None:
    model = perturbed(*ENC_DEC)
    enc, dec = torch.randint(0, 64, (2, 7)), torch.randint(0, 64, (2, 5))
    a = model(dec, encoder_input_ids=enc).logits
    b = model(dec, memory=model.encode(enc)).logits
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    with pytest.raises(ValueError, match="encoder_input_ids"):
        model(dec)


def test_t5_bias_direction_per_stack() -> None:
    model = perturbed(*ENC_DEC, "model.position.kind=t5")
    assert model.encoder.position.bidirectional and not model.decoder.position.bidirectional


# --------------------------------------------------------------------------- universal looping


def _moe(loops: int, *flags: str):
    return load_config(
        "tiny-moe-values",
        [*TINY, "model.n_layers=1", f"model.loops={loops}", *flags],
    ).model


def test_universal_stack_applies_one_block_loops_times() -> None:
    model = build_model(_moe(3)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    stack = model.decoder
    assert len(stack.blocks) == 1 and stack.loops == 3 and stack.n_slots == 3
    ids = torch.randint(0, 64, (2, 6))
    x = model._embed(ids, 0)
    ctx = stack.context(6, 0, x.device, False, x.dtype)
    # fixed per-loop step signal, no params, scaled to the embeddings' init std per dimension
    signal = SinusoidalPositions(32, scale=2**0.5 * model.cfg.init_std)(torch.arange(3))
    for step in range(3):
        x = x + signal[step]
        x, _ = stack.blocks[0](x, ctx, slot=step)
    want = model.lm_head(stack.final_norm(x))
    torch.testing.assert_close(model(ids).logits, want, atol=1e-12, rtol=0)


def test_looping_shares_weights_across_loops() -> None:
    a, b = count(_moe(2)), count(_moe(6))
    assert a.by_part == b.by_part
    built = [build_model(_moe(n)) for n in (2, 6)]
    n_block = [sum(p.numel() for p in m.decoder.blocks.parameters()) for m in built]
    assert n_block[0] == n_block[1]
    assert a.kv_cache_bytes_per_token * 3 == b.kv_cache_bytes_per_token  # one slot per loop


def test_universal_parameter_count_is_independent_of_loops() -> None:
    """The per-loop step signal is fixed (sinusoidal, as in Universal Transformers)."""
    a, b = count(_moe(2)), count(_moe(6))
    assert a.total == b.total and a.non_embedding == b.non_embedding
    built = [sum(p.numel() for p in build_model(_moe(n)).parameters()) for n in (2, 6)]
    assert built[0] == built[1]
