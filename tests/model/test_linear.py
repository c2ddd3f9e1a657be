"""The decoding layout of model/linear.py: same numbers as nn.Linear, scoped, never stale."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import attnlab.model.attention_layer as attention_layer
import attnlab.model.linear as linear
from attnlab.model import build_model, generate
from attnlab.model.linear import ROWS_MAX, Linear, decode_layout, param_key, split_columns
from tests.helpers.model import tiny

pytestmark = pytest.mark.usefixtures("float64")


@pytest.mark.parametrize("bias", [False, True])
def test_linear_is_nn_linear_outside_the_layout(bias: bool) -> None:
    lin = Linear(8, 5, bias=bias)
    assert isinstance(lin, nn.Linear)
    assert set(lin.state_dict()) == set(nn.Linear(8, 5, bias=bias).state_dict())
    x = torch.randn(3, 4, 8)
    assert torch.equal(lin(x), F.linear(x, lin.weight, lin.bias))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_split_columns_blocks_are_w_transposed_by_column_groups(threads: int) -> None:
    torch.set_num_threads(threads)  # the fixture restores it
    w = torch.randn(12, 5)
    blocks = split_columns(w)
    n = threads if 12 % threads == 0 else 1
    assert blocks.shape == (n, 5, 12 // n) and blocks.is_contiguous()
    assert torch.equal(torch.cat(list(blocks), dim=1), w.t())
    w7 = torch.randn(7, 5)  # 7 columns do not split in 2 or 3: one block
    assert split_columns(w7).shape == (1, 5, 7)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 1, 8), (3, 8), (2, 5, 8), (8,)])
def test_layout_matches_f_linear_while_open(bias: bool, shape: tuple[int, ...]) -> None:
    torch.set_num_threads(2)
    lin = Linear(8, 6, bias=bias)
    x = torch.randn(*shape)
    with torch.no_grad(), decode_layout(lin):
        assert lin._blocks is not None and lin._blocks[1].shape == (2, 8, 3)
        got = lin(x)
    assert lin._blocks is None
    assert got.shape == (*shape[:-1], 6)
    torch.testing.assert_close(got, F.linear(x, lin.weight, lin.bias), rtol=0, atol=1e-12)


def test_many_rows_take_the_plain_path() -> None:
    lin = Linear(8, 6)
    x = torch.randn(ROWS_MAX + 1, 8)
    with torch.no_grad(), decode_layout(lin):
        assert torch.equal(lin(x), F.linear(x, lin.weight, lin.bias))


def test_layout_with_autograd_on_takes_the_plain_path() -> None:
    lin = Linear(8, 5)
    x = torch.randn(2, 8)
    with decode_layout(lin):
        y = lin(x)
        y.sum().backward()
    assert torch.equal(y, F.linear(x, lin.weight, lin.bias))
    assert lin.weight.grad is not None and lin.weight.grad.abs().sum() > 0


def test_layout_rebuilds_its_copy_after_an_in_place_weight_change() -> None:
    lin = Linear(8, 5, bias=False)
    x = torch.randn(2, 8)
    with torch.no_grad(), decode_layout(lin):
        before = lin(x)
        lin.weight.mul_(2.0)
        after = lin(x)
        assert lin._blocks is not None and lin._blocks[0] == param_key((lin.weight,))  # rebuilt
    torch.testing.assert_close(after, 2.0 * before, rtol=0, atol=1e-12)


def test_disabled_layout_does_nothing() -> None:
    lin = Linear(8, 5)
    with torch.no_grad(), decode_layout(lin, enabled=False):
        assert lin._blocks is None


@pytest.mark.parametrize(
    "flags",
    [
        [],
        ["model.bias=true"],
        ["model.query.kind=nonlinear", "model.attention.fuse_qkv=true"],
        ["model.query.kind=anchored", "model.bias=true"],
        ["model.feature_map.kind=pre_projection", "model.side_branch.kind=content_skip"],
        ["model.ffn.kind=swiglu", "model.attention.n_kv_heads=2"],
    ],
)
def test_model_logits_are_the_same_in_the_layout(
    monkeypatch: pytest.MonkeyPatch, flags: list[str]
) -> None:
    torch.set_num_threads(2)  # two column blocks per weight
    model = build_model(tiny(*flags)).eval()
    ids = torch.randint(0, 64, (2, 12))  # 24 rows: under ROWS_MAX, so the layout is used
    calls, original = [], linear.matmul_split

    def counted(x, blocks, bias):
        calls.append(blocks.shape)
        return original(x, blocks, bias)

    monkeypatch.setattr(linear, "matmul_split", counted)  # Linear layers
    monkeypatch.setattr(attention_layer, "matmul_split", counted)  # the fused K, V, W1 weight
    with torch.no_grad():
        plain = model(ids).logits
        assert not calls
        with decode_layout(model):
            rows = model(ids).logits
        n_linear = sum(isinstance(m, Linear) for m in model.modules())
        assert len(calls) >= n_linear // 2 and all(c[0] == 2 for c in calls)
        again = model(ids).logits  # the fused-weight cache is keyed by layout
    torch.testing.assert_close(rows, plain, rtol=0, atol=1e-10)
    assert torch.equal(again, plain)
    assert all(getattr(m, "_blocks", None) is None for m in model.modules())


@pytest.mark.parametrize("use_cache", [True, False])
def test_generate_gives_the_same_tokens_with_either_layout(use_cache: bool) -> None:
    torch.set_num_threads(2)
    model = build_model(tiny("model.query.kind=nonlinear")).eval()
    prompt = torch.randint(0, 64, (2, 4))
    a = generate(model, prompt, 8, temperature=0.0, use_cache=use_cache, rows_layout=True)
    b = generate(model, prompt, 8, temperature=0.0, use_cache=use_cache, rows_layout=False)
    assert torch.equal(a, b)


def test_generate_returns_an_ordinary_tensor_and_restores_the_mode() -> None:
    model = build_model(tiny()).train()
    out = generate(model, torch.randint(0, 64, (1, 3)), 4, temperature=0.0)
    assert not out.is_inference()  # usable as training input after decoding
    assert model.training
    loss = model(out[:, :-1], out[:, 1:]).loss
    loss.backward()  # nothing created under inference mode leaks into autograd
    assert all(getattr(m, "_blocks", None) is None for m in model.modules())
