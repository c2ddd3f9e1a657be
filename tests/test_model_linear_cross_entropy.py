"""Chunked LM head + cross-entropy (model/linear_cross_entropy.py) = logits + F.cross_entropy."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import attnlab.model.linear_cross_entropy as lce
from attnlab.model import build_model
from attnlab.model.linear_cross_entropy import linear_cross_entropy
from model_helpers import _float64, tiny  # noqa: F401 (autouse fixture)


def _reference(h, w, t):
    return F.cross_entropy((h @ w.t()).reshape(-1, w.shape[0]), t.reshape(-1), ignore_index=-100)


@pytest.mark.parametrize("chunk", [1, 7, 64, 10_000])
@pytest.mark.parametrize("ignored", [0.0, 0.4])
def test_loss_and_gradients_equal_the_logits_path(
    monkeypatch: pytest.MonkeyPatch, chunk: int, ignored: float
) -> None:
    monkeypatch.setitem(lce.CHUNK_ELEMENTS, "cpu", chunk * 50)  # rows per chunk = chunk
    h = torch.randn(3, 9, 16, requires_grad=True)
    w = torch.randn(50, 16, requires_grad=True)
    t = torch.randint(0, 50, (3, 9))
    t[torch.rand(3, 9) < ignored] = -100
    got = linear_cross_entropy(h, w, t)
    (gh, gw) = torch.autograd.grad(2.5 * got, (h, w))
    ref = _reference(h, w, t)
    (rh, rw) = torch.autograd.grad(2.5 * ref, (h, w))
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(gh, rh, rtol=0, atol=1e-12)
    torch.testing.assert_close(gw, rw, rtol=0, atol=1e-12)
    assert torch.all(gh[t == -100] == 0)  # ignored rows get no gradient


def test_without_autograd_only_the_loss_is_computed() -> None:
    h, w = torch.randn(20, 8), torch.randn(30, 8)
    t = torch.randint(0, 30, (20,))
    with torch.no_grad():
        got = linear_cross_entropy(h, w, t)
    torch.testing.assert_close(got, _reference(h, w, t), rtol=0, atol=1e-12)


def test_frozen_weight_gets_no_gradient_and_h_still_does() -> None:
    h = torch.randn(6, 8, requires_grad=True)
    w = torch.randn(30, 8)
    t = torch.randint(0, 30, (6,))
    (gh,) = torch.autograd.grad(linear_cross_entropy(h, w, t), (h,))
    (rh,) = torch.autograd.grad(_reference(h, w, t), (h,))
    torch.testing.assert_close(gh, rh, rtol=0, atol=1e-12)


def test_bf16_autocast_matches_the_autocast_logits_path() -> None:
    h = torch.randn(40, 32, dtype=torch.float32, requires_grad=True)
    w = torch.randn(64, 32, dtype=torch.float32, requires_grad=True)
    t = torch.randint(0, 64, (40,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = linear_cross_entropy(h, w, t)
        ref = F.cross_entropy((h @ w.t()).float(), t)
    assert got.dtype == torch.float32
    gh, gw = torch.autograd.grad(got, (h, w))
    rh, rw = torch.autograd.grad(ref, (h, w))
    assert gh.dtype == h.dtype and gw.dtype == w.dtype
    torch.testing.assert_close(got, ref, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(gh, rh, rtol=5e-2, atol=5e-3)
    torch.testing.assert_close(gw, rw, rtol=5e-2, atol=5e-3)


@pytest.mark.parametrize(
    "flags",
    [
        [],
        ["model.tie_embeddings=false"],
        ["model.family=encoder", "model.attention.mask=bidirectional"],
        ["model.value.kind=moe", "model.mlp=false"],
    ],
)
def test_model_loss_and_grads_are_the_same_with_return_logits_false(flags: list[str]) -> None:
    model = build_model(tiny(*flags))
    ids = torch.randint(0, 64, (2, 10))
    targets = torch.randint(0, 64, (2, 10))
    targets[:, ::3] = -100
    plain = model(ids, targets)
    g_plain = torch.autograd.grad(plain.loss, list(model.parameters()), allow_unused=True)
    fused = model(ids, targets, return_logits=False)
    g_fused = torch.autograd.grad(fused.loss, list(model.parameters()), allow_unused=True)
    assert fused.logits is None and plain.logits is not None
    torch.testing.assert_close(fused.loss, plain.loss, rtol=0, atol=1e-12)
    for a, b in zip(g_fused, g_plain, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
