"""Fused virtual heads (issue 14): ``score.kind = "virtual_heads_fused"`` computes the same function
as the materialised ``virtual_heads`` without the T x T map, for every option (1-D/2-D,
logits/probs, none/grouped/full mixing, GQA, RoPE/ALiBi/none): forward and gradients in float64,
KV-cache decoding, no future leak, right-padded encoder batches; plus the pieces of its algebra."""

from __future__ import annotations

import pytest
import torch

from attnlab.config import ConfigError, load_config
from attnlab.model import build_model, generate
from attnlab.model.positions import ALiBi
from attnlab.model.virtual_fused.alibi import alibi_columns
from attnlab.model.virtual_fused.geometry import Geometry, shift, shifts
from tests.helpers.model import bump, make_part, tiny

pytestmark = pytest.mark.usefixtures("float64")

FUSED = "model.score.kind=virtual_heads_fused"
REF = "model.score.kind=virtual_heads"
ENCODER = ["model.family=encoder", "model.mask.kind=full"]
MIXING = {
    "none": ["model.score.mixing=none"],
    "grouped": ["model.score.mixing=grouped", "model.score.group_size=2"],
    "full": ["model.score.mixing=full"],
}
POSITION = {
    "nopos": ["model.position.kind=none"],
    "rope": ["model.position.kind=rope"],
    "alibi": ["model.position.kind=alibi"],
}
HEADS = {"mha": [], "gqa": ["model.attention.n_kv_heads=2"]}


def _options(on: str, mixing: str, extra: tuple[str, ...] = ()) -> list[str]:
    return [f"model.score.on={on}", *MIXING[mixing], *extra]


def fused_and_reference(flags: list[str], score: list[str], spread: float = 0.1):
    """A fused model with every weight moved off its init by N(0, ``spread``) (the score kernel
    included), and the materialised model holding the same weights (its kernel the dense form
    of the fused one: zero outside each virtual head's group)."""
    fused = build_model(tiny(*flags, FUSED, *score))
    with torch.no_grad():
        for p in fused.parameters():
            p.add_(torch.randn_like(p) * spread)
    ref_score = [s for s in score if not s.startswith(("model.score.mixing", "model.score.group"))]
    ref = build_model(tiny(*flags, REF, *ref_score))
    state = fused.state_dict()
    for name, part in fused.named_modules():
        if type(part).__name__ == "VirtualHeadsFused":
            state[f"{name}.weight"] = part.dense_weight().detach()
    ref.load_state_dict(state)
    return fused.eval(), ref.eval()


def _assert_same_function(fused, ref, ids, **kw) -> None:
    w = torch.randn(*ids.shape, 64)
    out_f, out_r = fused(ids, **kw).logits, ref(ids, **kw).logits
    torch.testing.assert_close(out_f, out_r, atol=1e-12, rtol=0)
    (out_f * w).sum().backward()
    (out_r * w).sum().backward()
    ref_params = dict(ref.named_parameters())
    for name, p in fused.named_parameters():
        g_ref = ref_params[name].grad
        if name.endswith("score.weight"):  # the compact kernel reads the dense one's entries
            mods = dict(fused.named_modules())
            geo = mods[name.removesuffix(".weight")].geo
            mask = geo.dense(torch.ones_like(p)) > 0
            g_ref = g_ref[mask].view_as(p)
        torch.testing.assert_close(p.grad, g_ref, atol=1e-11, rtol=0, msg=name)


CAUSAL = [
    (on, mix, pos, heads)
    for on in ("logits", "probs")
    for mix in MIXING
    for pos in POSITION
    for heads in HEADS
]


@pytest.mark.parametrize(("on", "mixing", "pos", "heads"), CAUSAL, ids=lambda x: str(x))
def test_causal_fused_equals_materialised_forward_and_gradients(on, mixing, pos, heads) -> None:
    fused, ref = fused_and_reference([*POSITION[pos], *HEADS[heads]], _options(on, mixing))
    _assert_same_function(fused, ref, torch.randint(0, 64, (2, 11)))


@pytest.mark.parametrize(
    "score",
    [
        ("model.score.kernel_size=1",),
        ("model.score.kernel_size=2", "model.score.n_virtual=8"),
        ("model.score.kernel_size=5", "model.score.n_virtual=2"),
        ("model.score.kernel_size=4", "model.score.on=probs", "model.score.n_virtual=8"),
        ("model.score.kernel_size=6", "model.score.on=probs"),  # K > a short prompt's length
    ],
    ids=lambda s: "-".join(x.split(".")[-1] for x in s),
)
@pytest.mark.parametrize("mixing", ["none", "full"])
def test_kernel_sizes_and_more_or_fewer_virtual_heads(score, mixing) -> None:
    if mixing == "none" and any(s.endswith("n_virtual=2") for s in score):
        pytest.skip("per-head mixing makes a multiple of n_heads virtual heads")
    fused, ref = fused_and_reference(["model.attention.n_kv_heads=2"], [*MIXING[mixing], *score])
    _assert_same_function(fused, ref, torch.randint(0, 64, (2, 9)))


def test_random_kernels_far_from_the_identity() -> None:
    """Logits with kernel weights of order 1 (the probs form's normaliser may then cross zero,
    where the clamp makes both forms ill-conditioned; the near-identity cases cover it)."""
    fused, ref = fused_and_reference(["model.position.kind=rope"], _options("logits", "full"))
    with torch.no_grad():
        for m in (fused, ref):
            for b in m.decoder.blocks:
                b.attention.score.weight.normal_()
        for fb, rb in zip(fused.decoder.blocks, ref.decoder.blocks, strict=True):
            rb.attention.score.weight.copy_(fb.attention.score.dense_weight())
    _assert_same_function(fused, ref, torch.randint(0, 64, (2, 10)))


BIDIRECTIONAL = [
    (conv, on, mix, pos, heads)
    for conv in ("1d", "2d")
    for on in ("logits", "probs")
    for mix in MIXING
    for pos in ("nopos", "rope")
    for heads in HEADS
]


@pytest.mark.parametrize(("conv", "on", "mixing", "pos", "heads"), BIDIRECTIONAL, ids=str)
def test_encoder_fused_equals_materialised_forward_and_gradients(
    conv, on, mixing, pos, heads
) -> None:
    flags = [*ENCODER, *POSITION[pos], *HEADS[heads]]
    fused, ref = fused_and_reference(flags, _options(on, mixing, (f"model.score.conv={conv}",)))
    _assert_same_function(fused, ref, torch.randint(0, 64, (2, 9)))


@pytest.mark.parametrize(
    "score",
    [
        ("model.score.conv=2d", "model.score.kernel_size=5", "model.score.n_virtual=8"),
        ("model.score.conv=2d", "model.score.on=probs", "model.score.kernel_size=1"),
        ("model.score.conv=1d", "model.score.on=probs", "model.score.kernel_size=4"),
    ],
    ids=lambda s: "-".join(x.split("=")[-1] for x in s),
)
def test_encoder_kernel_sizes(score) -> None:
    fused, ref = fused_and_reference(ENCODER, ["model.score.mixing=grouped", *score])
    _assert_same_function(fused, ref, torch.randint(0, 64, (2, 7)))


# ----------------------------------------------------------------------------- padded batches


def _padded_batch(lengths: list[int], T: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 64, (len(lengths), T))
    real = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    return ids.masked_fill(~real, 0), real


ENCODER_KINDS = {
    "baseline": [],
    "baseline_alibi": ["model.position.kind=alibi"],
    "materialised_2d_logits": [REF, "model.score.conv=2d"],
    "materialised_2d_probs": [REF, "model.score.conv=2d", "model.score.on=probs"],
    "fused_2d_logits": [FUSED, "model.score.conv=2d"],
    "fused_2d_probs": [FUSED, "model.score.conv=2d", "model.score.on=probs"],
    "fused_1d_logits_none": [FUSED, "model.score.mixing=none"],
    "fused_1d_probs_gqa": [FUSED, "model.score.on=probs", "model.attention.n_kv_heads=2"],
}


@pytest.mark.parametrize("name", sorted(ENCODER_KINDS))
def test_padded_rows_equal_the_rows_alone(name: str) -> None:
    """A right-padded encoder batch: each row's real positions come out as if the row were run
    alone (the convolution's zero padding at the row's own end, padded keys masked)."""
    model = build_model(tiny(*ENCODER, "model.position.kind=rope", *ENCODER_KINDS[name]))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.eval()
    lengths = [10, 6, 3]
    ids, real = _padded_batch(lengths, 10)
    out = model(ids, padding_mask=real).logits
    for b, n in enumerate(lengths):
        alone = model(ids[b : b + 1, :n]).logits
        torch.testing.assert_close(out[b : b + 1, :n], alone, atol=1e-12, rtol=0)
    # without the mask the padding does reach the real positions of the short rows
    assert not torch.allclose(model(ids).logits[1, :6], out[1, :6], atol=1e-6)


def test_fused_and_materialised_agree_on_a_padded_batch() -> None:
    fused, ref = fused_and_reference(
        [*ENCODER, "model.position.kind=rope"],
        _options("probs", "grouped", ("model.score.conv=2d",)),
    )
    ids, real = _padded_batch([9, 4], 9)
    _assert_same_function(fused, ref, ids, padding_mask=real)


def test_padding_mask_is_refused_by_a_causal_model() -> None:
    from attnlab.base.errors import InvalidRequestError

    model = build_model(tiny())
    with pytest.raises(InvalidRequestError, match=r"padding_mask is for model\.family=.encoder."):
        model(torch.zeros(1, 4, dtype=torch.long), padding_mask=torch.ones(1, 4))


# --------------------------------------------------------------------- causality and decoding

DECODER_CASES = {
    "logits_full": _options("logits", "full"),
    "logits_none_alibi": [*_options("logits", "none"), *POSITION["alibi"]],
    "logits_grouped_gqa_rope": [*_options("logits", "grouped"), *HEADS["gqa"], *POSITION["rope"]],
    "probs_full_rope": [*_options("probs", "full"), *POSITION["rope"]],
    "probs_none_alibi_k4": [
        *_options("probs", "none"),
        *POSITION["alibi"],
        "model.score.kernel_size=4",
    ],
    "probs_grouped_gqa_8": [
        *_options("probs", "grouped"),
        *HEADS["gqa"],
        "model.score.n_virtual=8",
    ],
}


def _perturbed_fused(flags: list[str]):
    model = build_model(tiny(FUSED, *flags))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


@pytest.mark.parametrize("name", sorted(DECODER_CASES))
def test_no_future_leak_not_even_by_rounding(name: str) -> None:
    """Perturbing token t leaves every output before t bit-identical: no value after a query's
    position is ever read (the probs form's near-diagonal keys never subtract future terms)."""
    model = _perturbed_fused(DECODER_CASES[name])
    ids = torch.randint(0, 64, (2, 10))
    base = model(ids).logits
    for t in (1, 5, 9):
        out = model(bump(ids, t)).logits
        assert torch.equal(out[:, :t], base[:, :t])
        assert not torch.allclose(out[:, t], base[:, t])


@pytest.mark.parametrize("name", sorted(DECODER_CASES))
def test_cached_decoding_equals_the_uncached_forward(name: str) -> None:
    """Prefill (the fused path), a 2-token chunk against the cache (fused, queries offset from
    the keys) and one-token steps (the one row of the map) equal the uncached forward."""
    model = _perturbed_fused(DECODER_CASES[name])
    assert model.supports_cache and not model.needs_attention_matrix
    ids = torch.randint(0, 64, (2, 11))
    full = model(ids).logits
    cache = model.new_cache(2, 11, dtype=torch.float64)
    outs, pos = [], 0
    for n in (4, 2, 3, 1, 1):
        outs.append(model(ids[:, pos : pos + n], cache=cache).logits)
        pos += n
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-12, rtol=0)
    prompt = ids[:, :3]
    a = generate(model, prompt, 5, temperature=0.0, use_cache=True)
    b = generate(model, prompt, 5, temperature=0.0, use_cache=False)
    assert torch.equal(a, b)


def test_attention_maps_are_the_materialised_ones() -> None:
    fused, ref = fused_and_reference([], _options("probs", "grouped"))
    ids = torch.randint(0, 64, (1, 7))
    for mf, mr in zip(
        fused(ids, return_attn=True).attn, ref(ids, return_attn=True).attn, strict=True
    ):
        torch.testing.assert_close(mf, mr, atol=1e-13, rtol=0)


def test_identity_init_is_ordinary_attention() -> None:
    base = build_model(tiny()).eval()
    with torch.no_grad():
        for p in base.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    ids = torch.randint(0, 64, (2, 8))
    for score in (
        _options("logits", "none"),
        _options("probs", "full"),
        _options("logits", "grouped"),
    ):
        fused = build_model(tiny(FUSED, *score)).eval()
        missing, unexpected = fused.load_state_dict(base.state_dict(), strict=False)
        assert not unexpected and all(k.endswith("score.weight") for k in missing)
        torch.testing.assert_close(fused(ids).logits, base(ids).logits, atol=1e-12, rtol=0)


# ------------------------------------------------------------------------------- the algebra


def test_shift_reads_n_plus_d_and_zero_outside() -> None:
    x = torch.arange(1.0, 6.0).view(1, 1, 5, 1)
    assert shift(x, 2).flatten().tolist() == [3, 4, 5, 0, 0]
    assert shift(x, -1).flatten().tolist() == [0, 1, 2, 3, 4]
    assert shift(x, 7).abs().sum() == 0
    for d, view in zip([-2, 0, 3], shifts(x, [-2, 0, 3]), strict=True):
        assert torch.equal(view, shift(x, d))


def test_dense_weight_keeps_each_virtual_head_inside_its_group() -> None:
    geo = Geometry(H=4, H_kv=4, H_out=6, G=2, K=3, conv="1d")  # 2 groups of 2 heads, 3 each
    w = torch.randn(*geo.weight_shape())
    dense = geo.dense(w)
    assert dense.shape == (6, 4, 3)
    torch.testing.assert_close(dense[:3, :2], w[:3], atol=0, rtol=0)
    torch.testing.assert_close(dense[3:, 2:], w[3:], atol=0, rtol=0)
    assert dense[:3, 2:].abs().sum() == 0 and dense[3:, :2].abs().sum() == 0


def test_alibi_columns_carry_the_causal_bias() -> None:
    q, k, scale = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 9, 8), 0.3
    qa, ka = alibi_columns(q, k, scale, offset=4)  # queries at positions 4..8
    got = scale * qa @ ka.transpose(-1, -2)
    want = scale * q @ k.transpose(-1, -2) + ALiBi(4)(torch.arange(4, 9), torch.arange(9))
    causal = torch.ones(5, 9, dtype=torch.bool).tril(4)
    torch.testing.assert_close(got[..., causal], want[..., causal], atol=1e-12, rtol=0)


def test_part_declares_no_attention_matrix_and_its_costs() -> None:
    cfg = tiny(FUSED, "model.score.mixing=full", "model.attention.n_heads=4")
    assert not cfg.needs_attention_matrix
    part = make_part("score", "virtual_heads_fused", d_model=32, n_heads=4, mixing="full")
    base = make_part("score", "virtual_heads_fused", d_model=32, n_heads=4, mixing="none")
    T, dh, H = 16, 8, 4
    # full mixing: QK^T at width H d_h (H x), P V unchanged, plus the key convolution
    assert (
        part.extra_flops(T)
        == 2 * T * H * dh * H + 2 * T * dh * H + 2 * H * H * 3 * dh - 4 * T * dh * H
    )
    assert base.extra_flops(T) == 2 * H * 1 * 3 * dh  # per head: only the key convolution
    assert part.weight.shape == (4, 4, 3) and base.weight.shape == (4, 1, 3)
    assert any("query chunks" in n for n in part.notes())


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["model.position.kind=t5"], "not bilinear"),
        ([*ENCODER, "model.position.kind=alibi"], "causal stack only"),
        (["model.mask.kind=sliding", "model.mask.window=3"], "causal or bidirectional"),
        (["model.score.on=probs", "model.attention.dropout=0.1"], "dropout=0"),
        ([*ENCODER, "model.score.conv=2d", "model.score.kernel_size=4"], "odd"),
        (["model.score.conv=2d"], "only allowed in model.family='encoder'"),
        (["model.score.mixing=grouped", "model.score.group_size=3"], "must divide"),
        (["model.score.mixing=none", "model.score.n_virtual=6"], "multiple of the 4 head groups"),
    ],
)
def test_refused_combinations_name_the_key_and_the_fix(flags, needle) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(None, ["model.attention.n_heads=4", "model.d_model=32", FUSED, *flags])
    assert needle in str(e.value)


@pytest.mark.parametrize(
    "flags",
    [
        _options("logits", "full"),
        _options("probs", "grouped"),
        [*_options("probs", "none"), "model.score.kernel_size=4", *HEADS["gqa"]],
        [*ENCODER, *_options("logits", "grouped", ("model.score.conv=2d",))],
        [*ENCODER, *_options("probs", "full", ("model.score.conv=2d",))],
    ],
    ids=["logits_full", "probs_grouped", "probs_none_gqa", "enc_2d_logits", "enc_2d_probs"],
)
def test_every_call_runs_on_the_fused_kernel(flags) -> None:
    """With ``attention.backend = "flash"`` torch may not fall back to its math path (which
    forms the T x T matrix): training, padded batches and cached decoding all still run."""
    model = build_model(tiny(FUSED, "model.attention.backend=flash", *flags))
    ids = torch.randint(0, 64, (2, 9))
    if model.cfg.family == "encoder":
        _, real = _padded_batch([9, 5], 9)
        model(ids, padding_mask=real).logits.sum().backward()
        return
    model(ids).logits.sum().backward()
    model.eval()
    cache = model.new_cache(2, 9, dtype=torch.float64)
    for a, b in ((0, 5), (5, 7), (7, 8), (8, 9)):
        model(ids[:, a:b], cache=cache)


@pytest.mark.parametrize(
    ("flags", "score"),
    [
        (["model.position.kind=rope"], _options("logits", "full")),
        (["model.position.kind=alibi"], _options("probs", "full")),
        (
            [*ENCODER, "model.position.kind=rope"],
            _options("logits", "full", ("model.score.conv=2d",)),
        ),
    ],
    ids=["causal_logits", "causal_probs_alibi", "encoder_2d"],
)
def test_query_chunks_with_recomputation_are_exact(monkeypatch, flags, score) -> None:
    """Wide calls on CPU run in query chunks recomputed in the backward pass (forced here by a
    budget of a few scores): same outputs, gradients, padded rows and cached decoding; a chunk's
    dropout masks are drawn again identically in the backward pass (gradcheck)."""
    from attnlab.model.virtual_fused import chunked

    calls = []
    plan = chunked._plan
    monkeypatch.setattr(chunked, "BUDGET", 48)
    monkeypatch.setattr(chunked, "MIN_ROWS", 3)
    monkeypatch.setattr(chunked, "_plan", lambda *a: calls.append(1) or plan(*a))
    fused, ref = fused_and_reference(flags, score)
    ids = torch.randint(0, 64, (2, 10))
    if fused.cfg.family == "encoder":
        ids, real = _padded_batch([10, 6], 10)
        _assert_same_function(fused, ref, ids, padding_mask=real)
    else:
        _assert_same_function(fused, ref, ids)
        cache = fused.new_cache(2, 10, dtype=torch.float64)
        inc = torch.cat([fused(ids[:, a:b], cache=cache).logits for a, b in ((0, 6), (6, 10))], 1)
        torch.testing.assert_close(inc, ref(ids).logits, atol=1e-12, rtol=0)
    assert calls, "the call was not chunked"


def test_bench_shows_the_fused_variants_as_sdpa_and_the_materialised_as_o_t2() -> None:
    """The bench's attention column names the path each subject's layers took on a step."""
    from attnlab.bench.subjects import build_subject
    from attnlab.bench.training import attention_note, attention_paths

    base = load_config(
        "tiny", ["model.d_model=32", "model.n_layers=1", "model.attention.n_heads=2"]
    )
    notes = {}
    for name in (
        "virtual_heads",
        "virtual_heads_fused",
        "virtual_heads_fused_full",
        "virtual_heads_fused_probs",
    ):
        subject = build_subject(name, base, 16)
        with torch.no_grad():
            subject.model(torch.randint(0, 50, (2, 16)))
        paths = attention_paths(subject.model)
        notes[name] = attention_note(subject, batch=2, seq_len=16, paths=paths)
    assert notes.pop("virtual_heads").startswith("O(T^2 H)")
    assert set(notes.values()) == {"sdpa, O(T)"}


@pytest.mark.parametrize("dropout", [0.0, 0.3])
@pytest.mark.parametrize("mask", ["causal", "allowed", "padding"])
def test_chunked_attention_gradcheck(monkeypatch, dropout, mask) -> None:
    from attnlab.model.virtual_fused import chunked
    from attnlab.parts import ScoreContext

    monkeypatch.setattr(chunked, "BUDGET", 40)
    monkeypatch.setattr(chunked, "MIN_ROWS", 2)
    q, k = torch.randn(2, 2, 7, 6), torch.randn(2, 2, 9, 6)
    v = torch.randn(2, 2, 9, 3)
    ctx = {
        "causal": ScoreContext(None, True),
        "allowed": ScoreContext(torch.ones(7, 9, dtype=torch.bool).tril(2), False),
        "padding": ScoreContext(
            None, False, padding=torch.arange(9)[None, :] < torch.tensor([[9], [4]])
        ),
    }[mask]
    want = torch.nn.functional.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=None if mask == "causal" else chunked._allowed(ctx, 0, 7, 9, None),
        is_causal=mask == "causal",
        scale=0.4,
    )
    assert len(chunked._plan(7, 9, 2, ctx)) > 1

    def f(q, k, v):
        torch.manual_seed(5)
        return chunked.chunked_attention(q, k, v, ctx, 0.4, dropout)

    if not dropout:
        torch.testing.assert_close(f(q, k, v), want, atol=1e-12, rtol=0)
    torch.autograd.gradcheck(f, (q.requires_grad_(), k.requires_grad_(), v.requires_grad_()))


@pytest.mark.parametrize("budget,probs_calls", [(40, 8), (200, 4)], ids=["recompute", "keep"])
def test_causal_chunks_keep_their_probabilities_when_all_fit_the_budget(
    monkeypatch, budget, probs_calls
) -> None:
    """4 causal chunks of 2 rows hold 2 * 2 * (2*2 + 2*4 + 2*6 + 1*7) = 124 scores: under a budget
    of 40 the backward pass recomputes each chunk's probabilities (8 computations in all), under
    200 it reuses the forward's (4); both are exact, values and gradients."""
    from attnlab.model.virtual_fused import chunked
    from attnlab.parts import ScoreContext

    monkeypatch.setattr(chunked, "BUDGET", budget)
    monkeypatch.setattr(chunked, "MIN_ROWS", 2)
    probs = chunked._probs
    calls = []
    monkeypatch.setattr(chunked, "_probs", lambda *a: calls.append(1) or probs(*a))
    q, k, v = torch.randn(2, 2, 7, 6), torch.randn(2, 2, 9, 6), torch.randn(2, 2, 9, 3)
    ctx = ScoreContext(None, True)
    assert len(chunked._plan(7, 9, 2, ctx)) == 4
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = chunked.chunked_attention(*leaves, ctx, 0.4)
    g = torch.randn_like(out)
    out.backward(g)
    assert len(calls) == probs_calls
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    want = torch.nn.functional.scaled_dot_product_attention(*ref, is_causal=True, scale=0.4)
    want.backward(g)
    torch.testing.assert_close(out, want, atol=1e-12, rtol=0)
    for got, exp in zip(leaves, ref, strict=True):
        torch.testing.assert_close(got.grad, exp.grad, atol=1e-12, rtol=0)
    torch.autograd.gradcheck(
        lambda q, k, v: chunked.chunked_attention(q, k, v, ctx, 0.4),
        tuple(t.clone().requires_grad_() for t in (q, k, v)),
    )


@pytest.mark.parametrize(
    "module", ["attnlab.model.parts.virtual_heads", "attnlab.model.parts.virtual_heads_fused"]
)
def test_either_part_module_imports_first_in_a_fresh_process(module: str) -> None:
    """A spawned worker (``compare --jobs``) may import a part's module before the registry:
    the built-in modules must not import each other (a partially initialised module)."""
    import subprocess
    import sys

    code = f"import {module}; from attnlab.parts import registry; print(registry.kinds('score'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "virtual_heads_fused" in out.stdout
