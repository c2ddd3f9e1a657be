"""How the query is formed (SPEC 1.1): the nonlinear query against its formula computed by hand, the
authors' scale form against the explicit /2, the identity query, the anchored query's equivalence to
the linear one at init, and the fused K, V, W1 matmul against the unfused path on a whole model."""

from __future__ import annotations

import math
from contextlib import contextmanager

import pytest
import torch

from attnlab.model import build_model
from attnlab.model.parts.query import AnchoredQuery, IdentityQuery, LinearQuery, NonlinearQuery
from tests.helpers.model import ids, perturb, tiny


@contextmanager
def default_dtype(dtype: torch.dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


pytestmark = pytest.mark.usefixtures("float64")


_ACT = {
    "gelu": lambda a: 0.5 * a * (1 + torch.erf(a / math.sqrt(2))),
    "relu": lambda a: a.clamp_min(0),
    "relu2": lambda a: a.clamp_min(0) ** 2,
    "silu": lambda a: a * torch.sigmoid(a),
}


def _lin(layer: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    y = x @ layer.weight.T
    return y + layer.bias if layer.bias is not None else y


def f_by_hand(f, u: torch.Tensor, act: str) -> torch.Tensor:
    """f(u) = LN(act(RMSNorm(u) W1) W2), every step written out."""
    eps = f.rms.eps
    r = u / torch.sqrt((u**2).mean(-1, keepdim=True) + eps) * f.rms.weight
    z = _lin(f.w2, _ACT[act](_lin(f.w1, r)))
    mu = z.mean(-1, keepdim=True)
    var = ((z - mu) ** 2).mean(-1, keepdim=True)
    ln = (z - mu) / torch.sqrt(var + f.ln.eps) * f.ln.weight
    return ln + f.ln.bias if f.ln.bias is not None else ln


# -------------------------------------------------------------------------------------- nonlinear


@pytest.mark.parametrize("act", ["gelu", "relu", "relu2", "silu"])
@pytest.mark.parametrize("bias", [False, True])
def test_nonlinear_query_matches_hand_computation(act: str, bias: bool) -> None:
    cfg = tiny(
        "model.query.kind=nonlinear", f"model.query.activation={act}", f"model.bias={bias}".lower()
    )
    attn = build_model(cfg).decoder.blocks[0].attention
    q = attn.query
    assert isinstance(q, NonlinearQuery)
    perturb(q, 0.3)
    u = torch.randn(2, 5, 32)
    want = (u + f_by_hand(q.f, u, act)) / 2
    torch.testing.assert_close(q(u), want, atol=1e-12, rtol=0)
    # the attention layer's fused K, V, W1 projection yields the same q
    attn.fused = True
    torch.testing.assert_close(attn.project_qkv(u)[0], want, atol=1e-12, rtol=0)


def test_nonlinear_query_bottleneck_shapes_and_params() -> None:
    q = build_model(tiny("model.query.kind=nonlinear")).decoder.blocks[0].attention.query
    d, r = 32, 16
    assert q.f.w1.weight.shape == (r, d) and q.f.w2.weight.shape == (d, r)
    mats = sum(p.numel() for p in q.parameters() if p.dim() == 2)
    assert mats == 2 * d * r == d * d  # the same matrix params as W_Q
    vecs = sum(p.numel() for p in q.parameters() if p.dim() == 1)
    assert vecs == d + 2 * d  # RMSNorm gain + LayerNorm gain and bias (model.norm.bias)
    q = build_model(tiny("model.query.kind=nonlinear", "model.query.ratio=0.25")).decoder
    assert q.blocks[0].attention.query.f.w1.out_features == 8


def _capture_q_and_block_input(model, layer: int = 0):
    """Run hooks that record block ``layer``'s input x and the q its attention core receives."""
    seen: dict[str, torch.Tensor] = {}
    block = model.decoder.blocks[layer]
    h1 = block.register_forward_pre_hook(lambda m, a: seen.__setitem__("x", a[0]))
    h2 = block.attention.core.register_forward_pre_hook(lambda m, a: seen.__setitem__("q", a[0]))
    return seen, (h1, h2)


@pytest.mark.parametrize("fused", [True, False])
def test_nonlinear_query_inside_the_model_is_u_plus_f_over_two(fused: bool) -> None:
    model = build_model(
        tiny("model.query.kind=nonlinear", f"model.attention.fuse_qkv={fused}".lower())
    )
    perturb(model)
    seen, hooks = _capture_q_and_block_input(model, layer=1)
    model(ids())
    block = model.decoder.blocks[1]
    u = block.norm1(seen["x"])
    want = (u + f_by_hand(block.attention.query.f, u, "gelu")) / 2
    B, H, T, dh = seen["q"].shape
    torch.testing.assert_close(seen["q"].transpose(1, 2).reshape(B, T, H * dh), want)
    for h in hooks:
        h.remove()


@pytest.mark.parametrize("position", ["learned", "rope", "alibi"])
def test_scale_form_equals_explicit_half_without_qk_norm(position: str) -> None:
    explicit = build_model(tiny("model.query.kind=nonlinear", f"model.position.kind={position}"))
    scaled = build_model(
        tiny(
            "model.query.kind=nonlinear",
            "model.query.scale_form=true",
            f"model.position.kind={position}",
        )
    )
    perturb(explicit)
    scaled.load_state_dict(explicit.state_dict())
    attn = scaled.decoder.blocks[0].attention
    assert attn.core.scale == pytest.approx(0.5 / math.sqrt(8))
    u = torch.randn(1, 3, 32)
    torch.testing.assert_close(attn.query(u), 2 * explicit.decoder.blocks[0].attention.query(u))
    x = ids()
    torch.testing.assert_close(scaled(x).logits, explicit(x).logits, atol=1e-12, rtol=0)


# --------------------------------------------------------------------------------------- identity


@pytest.mark.parametrize("fused", [True, False])
def test_identity_query_is_norm_of_x(fused: bool) -> None:
    model = build_model(
        tiny("model.query.kind=identity", f"model.attention.fuse_qkv={fused}".lower())
    )
    perturb(model)
    block = model.decoder.blocks[0]
    assert isinstance(block.attention.query, IdentityQuery)
    assert not list(block.attention.query.parameters())
    seen, hooks = _capture_q_and_block_input(model)
    model(ids())
    B, H, T, dh = seen["q"].shape
    q = seen["q"].transpose(1, 2).reshape(B, T, H * dh)
    torch.testing.assert_close(q, block.norm1(seen["x"]), atol=0, rtol=0)
    for h in hooks:
        h.remove()


def test_identity_query_removes_exactly_w_q() -> None:
    lin = sum(p.numel() for p in build_model(tiny()).parameters())
    ident = sum(p.numel() for p in build_model(tiny("model.query.kind=identity")).parameters())
    assert lin - ident == 2 * 32 * 32  # L * d^2


# --------------------------------------------------------------------------------------- anchored


def test_anchored_query_model_equals_the_linear_baseline_at_init() -> None:
    base = build_model(tiny())
    perturb(base)
    anchored = build_model(tiny("model.query.kind=anchored"))
    assert isinstance(anchored.decoder.blocks[0].attention.query, AnchoredQuery)
    missing, unexpected = anchored.load_state_dict(base.state_dict(), strict=False)
    assert not unexpected
    assert missing and all(".attention.query.f." in k for k in missing)  # only f is new
    x = ids()
    torch.testing.assert_close(anchored(x).logits, base(x).logits, atol=1e-12, rtol=0)
    # f really sits on the query path: a non-zero final LN gain changes the model
    with torch.no_grad():
        anchored.decoder.blocks[0].attention.query.f.ln.weight.fill_(1.0)
    assert not torch.allclose(anchored(x).logits, base(x).logits, atol=1e-6)


def test_anchored_mean_form_is_half_the_linear_query_at_init() -> None:
    base = build_model(tiny())
    perturb(base)
    anchored = build_model(tiny("model.query.kind=anchored", "model.query.mean=true"))
    anchored.load_state_dict(base.state_dict(), strict=False)
    u = torch.randn(2, 4, 32)
    lin = base.decoder.blocks[0].attention.query
    torch.testing.assert_close(anchored.decoder.blocks[0].attention.query(u), lin(u) / 2)


def test_anchored_query_matches_hand_computation_off_init() -> None:
    q = build_model(tiny("model.query.kind=anchored", "model.bias=true")).decoder.blocks[0]
    q = q.attention.query
    perturb(q, 0.3)
    u = torch.randn(2, 5, 32)
    torch.testing.assert_close(q(u), _lin(q.w_q, u) + f_by_hand(q.f, u, "gelu"), atol=1e-12, rtol=0)


def test_anchored_query_first_gradient_reaches_only_the_zero_gain() -> None:
    """At init f = LN(..) * 0: the gain gets a gradient, everything behind it gets exactly zero."""
    model = build_model(tiny("model.query.kind=anchored"))
    x = ids()
    model(x, targets=x).loss.backward()
    f = model.decoder.blocks[0].attention.query.f
    assert f.ln.weight.grad.abs().sum() > 0
    for p in (f.w1.weight, f.w2.weight, f.rms.weight):
        assert p.grad is None or torch.count_nonzero(p.grad) == 0


# ----------------------------------------------------------------------------------------- fusion

FUSABLE = ["linear", "identity", "nonlinear", "anchored"]


def _fused_pair(kind: str, bias: bool, n_kv: int):
    flags = [
        f"model.query.kind={kind}",
        f"model.bias={bias}".lower(),
        f"model.attention.n_kv_heads={n_kv}",
    ]
    fused = build_model(tiny(*flags, "model.attention.fuse_qkv=true"))
    plain = build_model(tiny(*flags, "model.attention.fuse_qkv=false"))
    perturb(fused)
    plain.load_state_dict(fused.state_dict())
    assert fused.decoder.blocks[0].attention.fused and not plain.decoder.blocks[0].attention.fused
    return fused, plain


@pytest.mark.parametrize("kind", FUSABLE)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("n_kv", [4, 2, 1])
def test_fused_equals_unfused_float32(kind: str, bias: bool, n_kv: int) -> None:
    with default_dtype(torch.float32):
        fused, plain = _fused_pair(kind, bias, n_kv)
        x = ids()
        torch.testing.assert_close(fused(x).logits, plain(x).logits, atol=2e-6, rtol=1e-6)


@pytest.mark.parametrize("kind", FUSABLE)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("n_kv", [4, 1])
def test_fused_equals_unfused_float64(kind: str, bias: bool, n_kv: int) -> None:
    fused, plain = _fused_pair(kind, bias, n_kv)
    x = ids()
    torch.testing.assert_close(fused(x).logits, plain(x).logits, atol=1e-12, rtol=0)


def test_fused_projection_is_one_matmul_of_the_documented_width() -> None:
    for kind, width in [("linear", 32), ("identity", 0), ("nonlinear", 16), ("anchored", 48)]:
        attn = build_model(tiny(f"model.query.kind={kind}", "model.attention.n_kv_heads=2"))
        attn = attn.decoder.blocks[0].attention
        assert attn.query.fused_width == width
        rows = sum(w.shape[0] for w, _ in attn.query.fused_weights())
        assert rows == width
        q, k, v = attn.project_qkv(torch.randn(1, 3, 32))
        assert q.shape == (1, 3, 32) and k.shape == v.shape == (1, 3, 16)


def test_linear_query_is_u_times_w_q() -> None:
    q = build_model(tiny("model.bias=true")).decoder.blocks[0].attention.query
    assert isinstance(q, LinearQuery)
    perturb(q)
    u = torch.randn(2, 3, 32)
    torch.testing.assert_close(q(u), _lin(q.w_q, u), atol=1e-12, rtol=0)
