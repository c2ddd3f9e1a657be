"""The formulas of the model's small parts, each against a hand computation or a reference
implementation: norms, feed-forward kinds, sinusoidal/learned/rotary positions, ALiBi slopes and
bias, T5 relative buckets (against transformers' own T5 code)."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.model import build_model
from attnlab.model.norms import LayerNorm, RMSNorm, ScaleNorm
from attnlab.model.parts.ffn import GLU, MLP
from attnlab.model.positions import (
    ALiBi,
    Rotary,
    SinusoidalPositions,
    T5RelativeBias,
    alibi_slopes,
)
from tests.helpers.model import slot_part, tiny

pytestmark = pytest.mark.usefixtures("float64")


def _randomise(module: torch.nn.Module) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p))


# ----------------------------------------------------------------------------------------- norms


@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_matches_formula(bias: bool) -> None:
    d, eps = 6, 1e-5
    norm = LayerNorm(d, bias=bias, eps=eps)
    _randomise(norm)
    x = torch.randn(3, 5, d) * 4 + 2
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)  # biased variance, as LayerNorm uses
    want = norm.weight * (x - mean) / torch.sqrt(var + eps)
    if bias:
        want = want + norm.bias
    else:
        assert norm.bias is None
    torch.testing.assert_close(norm(x), want, atol=1e-12, rtol=0)


@pytest.mark.fast
def test_rmsnorm_matches_formula() -> None:
    d, eps = 6, 1e-5
    norm = RMSNorm(d, eps=eps)
    _randomise(norm)
    x = torch.randn(3, 5, d) * 4 + 2
    want = norm.weight * x / torch.sqrt((x**2).mean(-1, keepdim=True) + eps)
    torch.testing.assert_close(norm(x), want, atol=1e-12, rtol=0)
    assert [n for n, _ in norm.named_parameters()] == ["weight"]


def test_scalenorm_matches_formula() -> None:
    d = 9
    norm = ScaleNorm(d, eps=1e-5)
    assert norm.weight.shape == () and float(norm.weight.detach()) == pytest.approx(3.0)  # sqrt(d)
    x = torch.randn(4, d)
    want = 3.0 * x / torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    torch.testing.assert_close(norm(x), want, atol=1e-12, rtol=0)
    # every output row has L2 norm g; the zero vector stays finite (max(||x||, eps))
    torch.testing.assert_close(norm(x).norm(dim=-1), torch.full((4,), 3.0))
    assert torch.equal(norm(torch.zeros(1, d)), torch.zeros(1, d))


@pytest.mark.parametrize(
    "kind,cls", [("layernorm", LayerNorm), ("rmsnorm", RMSNorm), ("scalenorm", ScaleNorm)]
)
def test_the_norm_slot_builds_the_configured_kind(kind: str, cls: type) -> None:
    """Every norm of the stack is the ``model.norm`` part, computing what the math class does."""
    cfg = tiny(f"model.norm.kind={kind}", "model.norm.eps=1e-3")
    model = build_model(cfg)
    block = model.decoder.blocks[0]
    for norm in (block.norm1, block.norm2, model.decoder.final_norm):
        assert norm.kind == kind and norm.eps == 1e-3
    ref = cls(cfg.d_model, eps=1e-3)
    _randomise(block.norm1)
    ref.load_state_dict(block.norm1.state_dict())
    x = torch.randn(2, 3, cfg.d_model)
    torch.testing.assert_close(block.norm1(x), ref(x), atol=0, rtol=0)


# ------------------------------------------------------------------------------------------- ffn

_ACT = {
    "gelu": lambda a: 0.5 * a * (1 + torch.erf(a / math.sqrt(2))),  # exact GELU, not tanh
    "relu": lambda a: a.clamp_min(0),
    "relu2": lambda a: a.clamp_min(0) ** 2,
    "silu": lambda a: a * torch.sigmoid(a),
}


@pytest.mark.parametrize("kind", ["gelu", "relu", "relu2", "swiglu", "geglu"])
@pytest.mark.parametrize("bias", [False, True])
def test_ffn_matches_formula(kind: str, bias: bool) -> None:
    cfg = tiny(f"model.ffn.kind={kind}", "model.ffn.ratio=2.5", f"model.bias={str(bias).lower()}")
    ffn = slot_part(cfg, "ffn")
    _randomise(ffn)
    d, h = 32, 80
    x = torch.randn(2, 3, d)

    def lin(layer, inp, rows=slice(None)):
        y = inp @ layer.weight[rows].T
        return y + layer.bias[rows] if layer.bias is not None else y

    if kind in ("swiglu", "geglu"):
        assert isinstance(ffn, GLU)
        gate = lin(ffn.w_gate_in, x, slice(0, h))
        inp = lin(ffn.w_gate_in, x, slice(h, 2 * h))
        act = _ACT["silu" if kind == "swiglu" else "gelu"]
        want = lin(ffn.w_out, act(gate) * inp)
        mats = 3 * d * h
    else:
        assert isinstance(ffn, MLP)
        want = lin(ffn.w_out, _ACT[kind](lin(ffn.w_in, x)))
        mats = 2 * d * h
    torch.testing.assert_close(ffn(x), want, atol=1e-10, rtol=0)
    n_bias = ((2 * h if kind in ("swiglu", "geglu") else h) + d) if bias else 0
    assert sum(p.numel() for p in ffn.parameters()) == mats + n_bias


def test_ffn_hidden_override_wins_over_ratio() -> None:
    cfg = tiny("model.ffn.hidden=7", "model.ffn.ratio=4")
    assert slot_part(cfg, "ffn").w_in.out_features == 7
    assert tiny("model.ffn.ratio=4.75").ffn_hidden == 152  # round(4.75 * 32)


# ------------------------------------------------------------------------------------- positions


@pytest.mark.parametrize("d", [8, 7])
def test_sinusoidal_table_values(d: int) -> None:
    table = SinusoidalPositions(d)(torch.arange(20))
    assert table.shape == (20, d)
    for t in (0, 1, 5, 19):
        for c in range(d):
            i = c // 2
            ang = t / 10000 ** (2 * i / d)
            want = math.sin(ang) if c % 2 == 0 else math.cos(ang)
            assert float(table[t, c]) == pytest.approx(want, abs=2e-6), (t, c)


def test_sinusoidal_model_adds_the_table_to_token_embeddings() -> None:
    model = build_model(tiny("model.position.kind=sinusoidal"))
    ids = torch.randint(0, 64, (2, 5))
    table = SinusoidalPositions(32)(torch.arange(3, 8))
    # scaled so each dimension's RMS equals the token embeddings' init std
    want = model.embed.weight[ids] + 2**0.5 * model.cfg.init_std * table
    torch.testing.assert_close(model._embed(ids, 3), want)
    assert not [n for n, _ in model.named_parameters() if "abs_pos" in n]


def test_learned_positions_are_a_table_indexed_by_absolute_position() -> None:
    model = build_model(tiny("model.position.kind=learned"))
    assert model.abs_pos.kind == "learned"
    ids = torch.randint(0, 64, (2, 5))
    table = model.abs_pos.table.weight
    assert table.shape == (32, 32)
    torch.testing.assert_close(model._embed(ids, 4), model.embed.weight[ids] + table[4:9])
    with pytest.raises(ValueError, match="max_seq_len"):
        model._embed(torch.randint(0, 64, (1, 3)), 30)


def _rotate(rot: Rotary, x: torch.Tensor, pos: int) -> torch.Tensor:
    cos, sin = rot.cos_sin(torch.tensor([pos]), torch.float64)
    return rot.apply(x[None, None, None, :], cos, sin)[0, 0, 0]


def test_rope_score_depends_only_on_relative_position() -> None:
    rot = Rotary(16)
    q, k = torch.randn(16), torch.randn(16)
    for s, t in [(0, 3), (2, 5), (7, 10), (40, 43)]:
        score = _rotate(rot, q, s) @ _rotate(rot, k, t)
        ref = _rotate(rot, q, 0) @ _rotate(rot, k, 3)
        assert float(score) == pytest.approx(float(ref), abs=1e-5)
    # ... and it does depend on the offset, and rotation keeps the norm
    assert abs(float(_rotate(rot, q, 0) @ _rotate(rot, k, 1) - q @ k)) > 1e-3
    assert float(_rotate(rot, q, 17).norm()) == pytest.approx(float(q.norm()), rel=1e-6)
    torch.testing.assert_close(_rotate(rot, q, 0), q)


def test_rope_partial_fraction_rotates_only_the_first_dims() -> None:
    rot = Rotary(16, fraction=0.25)
    assert rot.rot == 4
    x = torch.randn(2, 3, 6, 16)
    cos, sin = rot.cos_sin(torch.arange(6), torch.float64)
    y = rot.apply(x, cos, sin)
    assert torch.equal(y[..., 4:], x[..., 4:])
    assert not torch.allclose(y[..., 1:, :4], x[..., 1:, :4])


@pytest.mark.parametrize("head_dim,fraction", [(16, 1.0), (16, 0.25), (12, 0.5)])
def test_rope_matches_transformers_gpt_neox(head_dim: int, fraction: float) -> None:
    neox = pytest.importorskip("transformers.models.gpt_neox.modeling_gpt_neox")
    base = 10000.0
    rot = Rotary(head_dim, fraction=fraction, base=base)
    rdim = int(head_dim * fraction)
    # GPT-NeoX's rotary tables: inv_freq = 1 / base^(2i / rdim), emb = cat(freqs, freqs)
    inv = 1.0 / (base ** (torch.arange(0, rdim, 2, dtype=torch.int64).double() / rdim))
    freqs = torch.outer(torch.arange(9).double(), inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = rot.cos_sin(torch.arange(9), torch.float64)
    torch.testing.assert_close(cos, emb.cos(), atol=1e-6, rtol=0)
    torch.testing.assert_close(sin, emb.sin(), atol=1e-6, rtol=0)
    q, k = torch.randn(2, 3, 9, head_dim), torch.randn(2, 3, 9, head_dim)
    hq, hk = neox.apply_rotary_pos_emb(q, k, emb.cos()[None], emb.sin()[None])
    torch.testing.assert_close(rot.apply(q, emb.cos(), emb.sin()), hq, atol=1e-12, rtol=0)
    torch.testing.assert_close(rot.apply(k, emb.cos(), emb.sin()), hk, atol=1e-12, rtol=0)


def test_alibi_slopes_power_of_two() -> None:
    torch.testing.assert_close(
        alibi_slopes(8), torch.tensor([2.0**-i for i in range(1, 9)]), atol=0, rtol=0
    )
    torch.testing.assert_close(
        alibi_slopes(4), torch.tensor([2.0 ** (-2 * i) for i in range(1, 5)]), atol=0, rtol=0
    )


def _alibi_reference(n: int) -> list[float]:
    """The ALiBi authors' get_slopes (Press et al., fairseq reference code), restated."""

    def pow2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return pow2(n)
    closest = 2 ** math.floor(math.log2(n))
    return pow2(closest) + _alibi_reference(2 * closest)[0::2][: n - closest]


def test_alibi_slopes_twelve_heads_known_values() -> None:
    # 8 heads' slopes 1/2 .. 1/256, then every other slope of 16 heads: 2^-0.5, 2^-1.5, ...
    want = [2.0**-i for i in range(1, 9)] + [2 ** -(i + 0.5) for i in range(4)]
    torch.testing.assert_close(alibi_slopes(12), torch.tensor(want), atol=1e-15, rtol=0)
    for n in (3, 5, 6, 12, 20, 24):
        torch.testing.assert_close(alibi_slopes(n), torch.tensor(_alibi_reference(n)))


def test_alibi_bias_penalises_distance() -> None:
    alibi = ALiBi(4)
    pos = torch.arange(6)
    bias = alibi(pos, pos)
    m = alibi_slopes(4)
    for h in range(4):
        for i in range(6):
            for j in range(i + 1):
                assert float(bias[h, i, j]) == pytest.approx(-float(m[h]) * (i - j))
    assert (bias <= 0).all() and (bias.diagonal(dim1=1, dim2=2) == 0).all()


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("buckets,max_distance", [(32, 128), (16, 40), (8, 20)])
def test_t5_buckets_match_transformers(bidirectional: bool, buckets: int, max_distance: int):
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    rel = torch.arange(-300, 301)
    ours = T5RelativeBias(2, buckets, max_distance, bidirectional).bucket(rel)
    ref = t5.T5Attention._relative_position_bucket(
        rel, bidirectional=bidirectional, num_buckets=buckets, max_distance=max_distance
    )
    assert torch.equal(ours, ref)


def test_t5_bias_table_is_shared_by_the_layers_of_a_stack() -> None:
    model = build_model(tiny("model.position.kind=t5", "model.n_layers=3"))
    tables = [n for n, _ in model.named_parameters() if "position" in n]
    assert tables == ["decoder.position.table.weight"]
    assert model.decoder.position.table.weight.shape == (32, 4)  # buckets x heads


def test_t5_bias_looks_up_the_bucket_of_key_minus_query() -> None:
    t5 = T5RelativeBias(3, 16, 40, bidirectional=True)
    q_pos, k_pos = torch.arange(2, 7), torch.arange(0, 9)
    bias = t5(q_pos, k_pos)
    assert bias.shape == (3, 5, 9)
    for a, i in enumerate(q_pos.tolist()):
        for b, j in enumerate(k_pos.tolist()):
            bucket = t5.bucket(torch.tensor(j - i))
            torch.testing.assert_close(bias[:, a, b], t5.table.weight[bucket])
    # the two directions use different buckets in a bidirectional stack
    assert int(t5.bucket(torch.tensor(3))) != int(t5.bucket(torch.tensor(-3)))


@pytest.mark.parametrize("kind", ["alibi", "t5"])
def test_logit_bias_reaches_the_attention_probabilities(kind: str) -> None:
    """With W_Q = 0 the logits are the position bias alone: probs = softmax(bias) over j <= i."""
    model = build_model(
        tiny(f"model.position.kind={kind}", "model.attention.fuse_qkv=false")
    ).eval()
    _randomise(model.decoder.blocks[0].attention.key.w_k)
    with torch.no_grad():
        model.decoder.blocks[0].attention.query.w_q.weight.zero_()
    T = 7
    out = model(torch.randint(0, 64, (1, T)), return_attn=True)
    pos = torch.arange(T)
    bias = model.decoder.position.bias(pos, pos)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    want = torch.softmax(bias.masked_fill(~causal, float("-inf")), dim=-1)
    torch.testing.assert_close(out.attn[0][0], want, atol=1e-12, rtol=0)
