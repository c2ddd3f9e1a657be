"""Virtual heads (SPEC 1.5): the convolution over the T x T x H attention image by hand, the causal
1-D form reading only earlier keys, and the identity-kernel init reproducing ordinary attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.model import build_model
from tests.helpers.model import make_part, tiny

pytestmark = pytest.mark.usefixtures("float64")


def test_causal_1d_conv_by_hand() -> None:
    """s'[h', i, j] = sum_h sum_(t<K) w[h', h, t] s[h, i, j - t] (zero for j - t < 0)."""
    vh = make_part("score", "virtual_heads", n_heads=3, d_model=3, kernel_size=3, n_virtual=5)
    with torch.no_grad():
        vh.weight.copy_(torch.randn_like(vh.weight))
    s = torch.randn(2, 3, 4, 6)
    out = vh.transform(s, torch.ones(4, 6, dtype=torch.bool))
    assert out.shape == (2, 5, 4, 6)
    want = torch.zeros(2, 5, 4, 6)
    for o in range(5):
        for h in range(3):
            for t in range(3):
                want[:, o, :, t:] += vh.weight[o, h, t] * s[:, h, :, : 6 - t]
    torch.testing.assert_close(out, want, atol=1e-12, rtol=0)


def test_2d_conv_by_hand() -> None:
    vh = make_part("score", "virtual_heads", n_heads=2, d_model=2, kernel_size=3, conv="2d")
    with torch.no_grad():
        vh.weight.copy_(torch.randn_like(vh.weight))
    s = torch.randn(1, 2, 5, 5)
    want = F.conv2d(F.pad(s, (1, 1, 1, 1)), vh.weight)
    torch.testing.assert_close(vh.transform(s, torch.ones(5, 5, dtype=torch.bool)), want)


@pytest.mark.parametrize("conv", ["1d", "2d"])
def test_identity_kernel_at_init(conv: str) -> None:
    vh = make_part("score", "virtual_heads", n_heads=4, d_model=4, kernel_size=3, conv=conv)
    s = torch.randn(2, 4, 5, 5)
    torch.testing.assert_close(
        vh.transform(s, torch.ones(5, 5, dtype=torch.bool)), s, atol=0, rtol=0
    )
    assert vh.weight.numel() == 4 * 4 * (3 if conv == "1d" else 9)


@pytest.mark.parametrize(
    "flags",
    [
        ["model.score.on=logits"],
        ["model.score.on=probs"],
        ["model.score.on=probs", "model.position.kind=alibi"],
        [
            "model.family=encoder",
            "model.mask.kind=full",
            "model.score.conv=2d",
        ],
    ],
    ids=["logits", "probs", "probs_alibi", "encoder_2d"],
)
def test_virtual_heads_model_starts_as_ordinary_attention(flags: list[str]) -> None:
    base_flags = [f for f in flags if not f.startswith("model.score")]
    base = build_model(tiny(*base_flags)).eval()
    with torch.no_grad():
        for p in base.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    vh = build_model(tiny(*flags, "model.score.kind=virtual_heads")).eval()
    missing, unexpected = vh.load_state_dict(base.state_dict(), strict=False)
    # the kernel is the only new weight
    assert not unexpected and missing
    assert all(k.endswith(".attention.score.weight") for k in missing)
    ids = torch.randint(0, 64, (2, 8))
    torch.testing.assert_close(vh(ids).logits, base(ids).logits, atol=1e-12, rtol=0)
    # and the convolution does act once the kernel moves
    stack = vh.decoder if vh.decoder is not None else vh.encoder
    with torch.no_grad():
        stack.blocks[0].attention.score.weight.add_(0.3)
    assert not torch.allclose(vh(ids).logits, base(ids).logits, atol=1e-6)


def test_more_virtual_heads_than_heads_read_values_per_kv_group() -> None:
    model = build_model(tiny("model.score.kind=virtual_heads", "model.score.n_virtual=8")).eval()
    attn = model.decoder.blocks[0].attention
    assert attn.score.weight.shape == (8, 4, 3)
    assert attn.mixer.w_o.in_features == 8 * 8  # W_O reads all virtual heads
    out = model(torch.randint(0, 64, (1, 6)), return_attn=True)
    assert out.attn[0].shape == (1, 8, 6, 6)
