"""Identity head with data-dependent head weights (SPEC 1.3, seed 004 "No MLP/Residuals").

At init all head weight sits on the identity head, so the model must compute exactly what an
MLP-only network computes; the reference below is written by hand from the model's own weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.config import load_config
from attnlab.model import build_model
from attnlab.model.parts.mixer import NonlinearMixer, removed_mlp_params
from tests.helpers.model import TINY, make_part

pytestmark = pytest.mark.usefixtures("float64")

# the full idea (preset) and the first rung of the ablation ladder (identity head, residual + MLP kept)
VARIANTS = {
    "preset": ("tiny-identity-head", []),
    "with_residual_and_mlp": ("tiny", ["model.readout.kind=identity_head"]),
    "residual_no_mlp": ("tiny", ["model.readout.kind=identity_head", "model.mlp=false"]),
}


def build(name: str):
    preset, flags = VARIANTS[name]
    cfg = load_config(preset, [*TINY, *flags]).model
    return build_model(cfg).eval(), cfg


def _lin(layer: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    y = x @ layer.weight.T
    return y + layer.bias if layer.bias is not None else y


def mlp_only_reference(model, cfg, ids: torch.Tensor) -> torch.Tensor:
    """Per token: embed + pos -> per layer: v_id = Norm(x) W_vid -> mixer([0 .. 0, v_id])
    (+ residual, + MLP per config) -> final norm -> head. No token ever sees another."""
    B, T = ids.shape
    x = model.embed.weight[ids] + model.abs_pos.table.weight[:T]
    for blk in model.decoder.blocks:
        attn = blk.attention
        u = blk.norm1(x)
        v_id = _lin(attn.readout.w_vid, u)
        mixed_in = torch.cat([torch.zeros(B, T, attn.H * attn.dh), v_id], dim=-1)
        if isinstance(attn.mixer, NonlinearMixer):
            y = _lin(attn.mixer.w_b, F.gelu(_lin(attn.mixer.w_a, mixed_in)))
        else:
            y = _lin(attn.mixer.w_o, mixed_in)
        x = x + y if cfg.residual else y
        if cfg.mlp:
            f = _lin(blk.ffn.w_out, F.gelu(_lin(blk.ffn.w_in, blk.norm2(x))))
            x = x + f if cfg.residual else f
    return model.decoder.final_norm(x) @ model.lm_head.weight.T


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_identity_head_model_at_init_is_the_mlp_only_network(name: str) -> None:
    model, cfg = build(name)
    ids = torch.randint(0, 64, (2, 10))
    want = mlp_only_reference(model, cfg, ids)
    torch.testing.assert_close(model(ids).logits, want, atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_at_init_perturbing_token_j_changes_only_output_j(name: str) -> None:
    model, _ = build(name)
    ids = torch.randint(0, 64, (1, 10))
    base = model(ids).logits
    for j in (0, 4, 9):
        alt = ids.clone()
        alt[0, j] = (alt[0, j] + 1) % 64
        out = model(alt).logits
        changed = (out - base).abs().amax(-1)[0] > 0
        assert changed.tolist() == [t == j for t in range(10)], j
    # once the head weights move off the identity head, tokens do mix (the test is not vacuous)
    for blk in model.decoder.blocks:
        torch.nn.init.normal_(blk.attention.readout.head_weights.weight, 0, 0.3)
    alt = ids.clone()
    alt[0, 0] = (alt[0, 0] + 1) % 64
    assert ((model(alt).logits - model(ids).logits).abs().amax(-1)[0, 1:] > 1e-9).all()


def test_head_weights_init_puts_everything_on_the_identity_head() -> None:
    model, _ = build("preset")
    for blk in model.decoder.blocks:
        hw = blk.attention.readout.head_weights
        assert torch.count_nonzero(hw.weight) == 0
        assert hw.bias.tolist() == [0.0, 0.0, 0.0, 0.0, 1.0]
        assert blk.ffn is None and blk.norm2 is None  # MLP blocks removed


def test_identity_head_formula_off_init() -> None:
    head = make_part("readout", "identity_head", d_model=12, n_heads=3, head_dim=4, bias=True)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn_like(p))
    u, heads = torch.randn(2, 5, 12), torch.randn(2, 3, 5, 4)
    w = _lin(head.head_weights, u)  # [B, T, H + 1]
    v_id = _lin(head.w_vid, u)
    parts = [heads[:, h] * w[..., h : h + 1] for h in range(3)] + [v_id * w[..., 3:4]]
    torch.testing.assert_close(head(u, heads), torch.cat(parts, -1), atol=1e-12, rtol=0)


def test_nonlinear_mixer_absorbs_the_removed_mlp_parameters() -> None:
    model, cfg = build("preset")
    mixer = model.decoder.blocks[0].attention.mixer
    assert isinstance(mixer, NonlinearMixer)
    n_in, d = (4 + 1) * 8, 32
    assert mixer.w_a.in_features == n_in
    removed = removed_mlp_params(cfg)
    assert removed == 2 * 32 * 128 + 32  # W_in, W_out and the MLP's LayerNorm gain (no biases)
    params = sum(p.numel() for p in mixer.parameters())
    # W_b act(W_a o) has hidden*(n_in + d) params: W_O's n_in*d plus the removed MLP, rounded
    assert abs(params - (n_in * d + removed)) <= (n_in + d) // 2
    # the layer as a whole keeps (to that rounding) the baseline's parameter budget
    base = build_model(load_config("tiny", TINY).model)
    n_var = sum(p.numel() for p in model.parameters())
    n_base = sum(p.numel() for p in base.parameters())
    # per layer: W_vid, the head-weight layer, and W_O's extra d_h input rows for the extra head
    head_extra = (32 * 8) + (32 + 1) * 5 + 8 * 32
    assert abs(n_var - n_base - 2 * head_extra) <= 2 * (n_in + d)


def _grads(fn, inputs: list[torch.Tensor], params: list[torch.Tensor]) -> list[torch.Tensor]:
    """fn(*inputs) and the gradients of a fixed loss on it w.r.t. the inputs and params."""
    for t in (*inputs, *params):
        t.grad = None
    out = fn(*inputs)
    weight = torch.linspace(-1, 1, out.numel()).view_as(out)
    (out * weight).sum().backward()
    return [out.detach(), *(t.grad for t in (*inputs, *params))]


@pytest.mark.parametrize("bias", [True, False])
def test_identity_head_fused_readout_equals_concat_then_weight(bias: bool) -> None:
    """The readout's one matmul over [W_vid; W_w] and its hand-written weighting gradient equal
    the plain form (two Linears, concatenate [heads | v_id], multiply by w) in float64, in values
    and in every gradient, for heads in SDPA's [B, T, H, d_h] memory layout and contiguous."""
    head = make_part("readout", "identity_head", d_model=12, n_heads=3, head_dim=4, bias=bias)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn_like(p))
    params = list(head.parameters())

    def plain(u, heads):
        B, H, T, dh = heads.shape
        allh = torch.cat([heads.transpose(1, 2), _lin(head.w_vid, u).unsqueeze(2)], dim=2)
        return (allh * _lin(head.head_weights, u).unsqueeze(-1)).reshape(B, T, (H + 1) * dh)

    u = torch.randn(2, 5, 12, requires_grad=True)
    for heads in (torch.randn(2, 5, 3, 4).transpose(1, 2), torch.randn(2, 3, 5, 4)):
        heads = heads.detach().requires_grad_()
        want = _grads(plain, [u, heads], params)
        got = _grads(head, [u, heads], params)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)
    assert torch.autograd.gradcheck(head, (u, heads))


@pytest.mark.parametrize("bias", [True, False])
def test_nonlinear_mixer_padded_hidden_equals_the_plain_mlp(bias: bool) -> None:
    """Training and prefill multiply with W_a, W_b zero-padded to a multiple of 16 hidden units;
    the output and every gradient are those of W_b act(W_a o) with the real m units (float64),
    and decoding a few rows without autograd (the Linears' own path) gives the same output."""
    from attnlab.model.parts.mixer import HIDDEN_MULTIPLE
    from attnlab.parts import Dims

    dims = Dims(d_model=12, n_heads=3, n_kv_heads=3, head_dim=4, bias=bias, mixer_in=15)
    mixer = make_part("mixer", "nonlinear", dims, hidden=21)
    assert mixer.hidden % HIDDEN_MULTIPLE != 0  # the padded path is taken
    with torch.no_grad():
        for p in mixer.parameters():
            p.copy_(torch.randn_like(p))
    params = list(mixer.parameters())

    def plain(o):
        return _lin(mixer.w_b, F.gelu(_lin(mixer.w_a, o)))

    o = torch.randn(2, 40, 15, requires_grad=True)
    want = _grads(plain, [o], params)
    got = _grads(mixer, [o], params)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)
    with torch.no_grad():
        torch.testing.assert_close(mixer(o[:1, :3]), plain(o[:1, :3]), atol=1e-12, rtol=1e-12)
