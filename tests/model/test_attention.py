"""The attention core and its masks: allowed-key matrices against hand-written ones, the fused SDPA
path against the explicit (math) path, GQA/MQA against MHA with K/V heads repeated, cache shapes, and
a model cast to bf16 still running (rotary tables follow the activations' dtype)."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend

from attnlab.config import AttentionConfig
from attnlab.model import build_model
from attnlab.model.attention import AttentionCore
from attnlab.model.masks import allowed_keys, stack_mask
from attnlab.parts import ScoreContext
from tests.helpers.model import perturb, tiny

pytestmark = pytest.mark.usefixtures("float64")


def grid(text: str) -> torch.Tensor:
    return torch.tensor([[c == "1" for c in row.split()[0]] for row in text.strip().splitlines()])


# ---------------------------------------------------------------------------------------- masks

MASKS = {
    ("causal", True, ()): """
        100000
        110000
        111000
        111100
        111110
        111111""",
    ("bidirectional", False, ()): "\n".join(["111111"] * 6),
    ("prefix", True, (("prefix_len", 2),)): """
        110000
        110000
        111000
        111100
        111110
        111111""",
    ("sliding", True, (("window", 2),)): """
        100000
        110000
        011000
        001100
        000110
        000011""",
    ("sliding", False, (("window", 2),)): """
        110000
        111000
        011100
        001110
        000111
        000011""",
    # window 2; global tokens: the first one and every 3rd (positions 0 and 3)
    ("local_global", True, (("window", 2), ("n_global", 1), ("global_every", 3))): """
        100000
        110000
        111000
        111100
        100110
        100111""",
    ("local_global", False, (("window", 2), ("n_global", 1), ("global_every", 3))): """
        111111
        111100
        111100
        111111
        100111
        100111""",
}


@pytest.mark.parametrize(
    "key", list(MASKS), ids=lambda k: f"{k[0]}-{'causal' if k[1] else 'bidir'}"
)
def test_allowed_keys_match_hand_written_matrices(key) -> None:
    mask, causal, extra = key
    cfg = AttentionConfig(mask=mask, **dict(extra))
    pos = torch.arange(6)
    assert torch.equal(allowed_keys(cfg, pos, pos, causal), grid(MASKS[key]))


@pytest.mark.fast
def test_allowed_keys_for_a_decoding_step_are_the_last_row() -> None:
    for key, text in MASKS.items():
        mask, causal, extra = key
        if not causal:
            continue
        cfg = AttentionConfig(mask=mask, **dict(extra))
        row = allowed_keys(cfg, torch.tensor([5]), torch.arange(6), causal)
        assert torch.equal(row, grid(text)[5:6]), key


def test_each_stack_takes_its_own_direction() -> None:
    """An encoder-decoder's encoder is bidirectional and its decoder causal, whatever the mask
    names; window patterns keep their window in both directions."""
    assert stack_mask(AttentionConfig(mask="causal"), causal=False) == "bidirectional"
    assert stack_mask(AttentionConfig(mask="bidirectional"), causal=True) == "causal"
    assert stack_mask(AttentionConfig(mask="prefix", prefix_len=2), causal=False) == "bidirectional"
    assert stack_mask(AttentionConfig(mask="sliding", window=2), causal=False) == "sliding"
    pos = torch.arange(4)
    assert allowed_keys(AttentionConfig(mask="causal"), pos, pos, causal=False).all()


# ---------------------------------------------------------------------------- SDPA vs explicit


def _qkv(H=4, Hkv=4, Tq=7, Tk=7, dh=8):
    return torch.randn(2, H, Tq, dh), torch.randn(2, Hkv, Tk, dh), torch.randn(2, Hkv, Tk, dh)


CORE_CASES = {
    "causal": dict(is_causal=True),
    "bidirectional": dict(is_causal=False),
    "sliding_mask": dict(allowed=grid(MASKS[("sliding", True, (("window", 2),))])),
    "bias_causal": dict(is_causal=True, bias=True),
    "bias_bidirectional": dict(is_causal=False, bias=True),
    "bias_and_mask": dict(allowed=grid(MASKS[("prefix", True, (("prefix_len", 2),))]), bias=True),
    "gqa_causal": dict(is_causal=True, Hkv=2),
    "mqa_bias": dict(is_causal=True, Hkv=1, bias=True),
    "decode_one_query": dict(is_causal=False, Tq=1),
    "chunk_bottom_right": dict(allowed=torch.ones(3, 7, dtype=torch.bool).tril(4), Tq=3),
}


@pytest.mark.parametrize("name", list(CORE_CASES))
def test_sdpa_path_equals_explicit_path(name: str) -> None:
    case = dict(CORE_CASES[name])
    Hkv, Tq = case.pop("Hkv", 4), case.pop("Tq", 6 if "allowed" not in case else None)
    allowed = case.pop("allowed", None)
    Tq = Tq or (allowed.shape[0] if allowed is not None else 6)
    Tk = allowed.shape[1] if allowed is not None else (7 if Tq == 1 else Tq)
    q, k, v = _qkv(Hkv=Hkv, Tq=Tq, Tk=Tk)
    bias = torch.randn(4, Tq, Tk) if case.pop("bias", False) else None
    ctx = ScoreContext(allowed, case.pop("is_causal", False), bias)
    fused, _ = AttentionCore(8, backend="auto")(q, k, v, ctx)
    explicit, probs = AttentionCore(8, backend="math")(q, k, v, ctx)
    torch.testing.assert_close(fused, explicit, atol=1e-12, rtol=0)
    # the explicit probabilities are softmax(q k^T / sqrt(d_h) + bias) over the allowed keys
    if Hkv != 4:
        k = k.repeat_interleave(4 // Hkv, dim=1)
    logits = q @ k.transpose(-2, -1) / 8**0.5 + (bias if bias is not None else 0)
    ok = allowed
    if ok is None:
        ok = torch.ones(Tq, Tk, dtype=torch.bool)
        if ctx.is_causal:
            ok = ok.tril(Tk - Tq)
    want = torch.softmax(logits.masked_fill(~ok, float("-inf")), -1)
    torch.testing.assert_close(probs, want, atol=1e-12, rtol=0)


class _Recorder:
    """A score transform as ``parts/slots.py`` ScorePart documents it: H -> H' = 6 heads (head 0
    doubled, heads 1, 2 copied), and garbage written at every masked entry (the core must
    discard it)."""

    def __init__(self, on: str) -> None:
        self.on, self.seen = on, []

    def transform(self, s, allowed):
        self.seen.append((s.clone(), allowed.clone()))
        out = torch.cat([s, 2 * s[:, :1], s[:, 1:2]], dim=1)
        return out.masked_fill(~allowed, 1e4 if self.on == "logits" else 7.0)


@pytest.mark.parametrize("on", ["logits", "probs"])
def test_explicit_path_calls_a_score_transform_as_the_contract_says(on: str) -> None:
    """A causal chunk with a cache in front (Tq=3 of Tk=5) and GQA (H=4, H_kv=2): the transform
    gets [B,H,Tq,Tk] scaled logits with masked entries 0 (on logits) or the softmax (on probs)
    and the [Tq,Tk] mask; what it writes at masked entries is discarded; probs are renormalised
    (on probs); v is repeated to H'; out = probs @ v."""
    q, k, v = _qkv(H=4, Hkv=2, Tq=3, Tk=5)
    t = _Recorder(on)
    core = AttentionCore(8, scale_multiplier=0.5)
    out, probs = core.explicit(q, k, v, ScoreContext(None, True), transform=t)
    allowed = torch.ones(3, 5, dtype=torch.bool).tril(2)  # key j <= query i + Tk - Tq
    logits = (q * 0.5 / 8**0.5) @ k.repeat_interleave(2, dim=1).transpose(-2, -1)
    (seen, mask), *more = t.seen
    assert not more and torch.equal(mask, allowed)

    def heads(s):
        return torch.cat([s, 2 * s[:, :1], s[:, 1:2]], dim=1)

    if on == "logits":
        torch.testing.assert_close(seen, logits.masked_fill(~allowed, 0.0), atol=1e-12, rtol=0)
        want = torch.softmax(heads(logits).masked_fill(~allowed, float("-inf")), -1)
    else:
        p = torch.softmax(logits.masked_fill(~allowed, float("-inf")), -1)
        torch.testing.assert_close(seen, p, atol=1e-12, rtol=0)
        want = heads(p).masked_fill(~allowed, 0.0)
        want = want / want.sum(-1, keepdim=True)
    assert probs.shape == (2, 6, 3, 5) and out.shape == (2, 6, 3, 8)
    torch.testing.assert_close(probs, want, atol=1e-12, rtol=0)
    torch.testing.assert_close(out, want @ v.repeat_interleave(3, dim=1), atol=1e-12, rtol=0)


@pytest.mark.parametrize(
    "flags",
    [
        [],
        ["model.position.kind=alibi"],
        ["model.position.kind=t5"],
        ["model.position.kind=rope", "model.attention.n_kv_heads=2"],
        ["model.attention.mask=sliding", "model.attention.window=3"],
        ["model.attention.mask=prefix", "model.attention.prefix_len=3"],
        ["model.family=encoder", "model.attention.mask=bidirectional"],
    ],
    ids=["causal", "alibi", "t5", "rope_gqa", "sliding", "prefix", "encoder"],
)
def test_whole_model_math_backend_equals_auto(flags: list[str]) -> None:
    auto = build_model(tiny(*flags)).eval()
    perturb(auto)
    math_ = build_model(tiny(*flags, "model.attention.backend=math")).eval()
    math_.load_state_dict(auto.state_dict())
    ids = torch.randint(0, 64, (2, 9))
    torch.testing.assert_close(math_(ids).logits, auto(ids).logits, atol=1e-12, rtol=0)
    out = auto(ids, return_attn=True)  # asking for the maps takes the explicit path
    torch.testing.assert_close(out.logits, auto(ids).logits, atol=1e-12, rtol=0)
    assert len(out.attn) == 2 and out.attn[0].shape == (2, 4, 9, 9)
    torch.testing.assert_close(out.attn[0].sum(-1), torch.ones(2, 4, 9))


# ----------------------------------------------------------------------------------- GQA / MQA


@pytest.mark.parametrize("n_kv", [1, 2, 4])
@pytest.mark.parametrize("position", ["learned", "rope"])
def test_gqa_equals_mha_with_repeated_kv_heads(n_kv: int, position: str) -> None:
    flags = [f"model.position.kind={position}", "model.bias=true"]
    gqa = build_model(tiny(*flags, f"model.attention.n_kv_heads={n_kv}")).eval()
    perturb(gqa)
    mha = build_model(tiny(*flags)).eval()
    state = gqa.state_dict()
    rep = 4 // n_kv
    for name, t in list(state.items()):
        if ".attention.key." in name or ".attention.value." in name:
            t = t.view(n_kv, 8, *t.shape[1:]).repeat_interleave(rep, dim=0)
            state[name] = t.reshape(32, *t.shape[2:])
    mha.load_state_dict(state)
    ids = torch.randint(0, 64, (2, 9))
    torch.testing.assert_close(gqa(ids).logits, mha(ids).logits, atol=1e-12, rtol=0)
    att = gqa.decoder.blocks[0].attention
    assert att.key.w_k.out_features == att.value.w_v.out_features == n_kv * 8


@pytest.mark.parametrize("n_kv", [1, 2, 4])
def test_cache_holds_n_kv_heads(n_kv: int) -> None:
    model = build_model(tiny(f"model.attention.n_kv_heads={n_kv}")).eval()
    cache = model.new_cache(3, 10, dtype=torch.float64)
    assert len(cache.k) == len(cache.v) == 2
    assert all(t.shape == (3, n_kv, 10, 8) for t in cache.k + cache.v)
    assert cache.nbytes() == 2 * 2 * 3 * n_kv * 10 * 8 * 8
    model(torch.randint(0, 64, (3, 4)), cache=cache)
    assert cache.length == 4
    assert cache.k[0][:, :, :4].abs().sum() > 0 and cache.k[0][:, :, 4:].abs().sum() == 0


def test_cache_overflow_is_refused() -> None:
    model = build_model(tiny()).eval()
    cache = model.new_cache(1, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="holds 4 positions"):
        model(torch.randint(0, 64, (1, 5)), cache=cache)


# ------------------------------------------------------------------------------------ dtypes


@pytest.mark.parametrize("position", ["rope", "alibi", "sinusoidal"])
def test_a_model_cast_to_bf16_runs_and_stays_close_to_float32(position: str) -> None:
    ref = build_model(tiny(f"model.position.kind={position}")).float().eval()
    half = build_model(tiny(f"model.position.kind={position}")).eval()
    half.load_state_dict(ref.state_dict())
    half = half.to(torch.bfloat16)
    ids = torch.randint(0, 64, (1, 12))
    with torch.no_grad():
        out = half(ids).logits
        want = ref(ids).logits
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), want, atol=0.05, rtol=0.05)


@pytest.mark.parametrize(
    "backend,kernels",
    [
        ("flash", {SDPBackend.FLASH_ATTENTION}),
        (
            "sdpa",
            {
                SDPBackend.FLASH_ATTENTION,
                SDPBackend.EFFICIENT_ATTENTION,
                SDPBackend.CUDNN_ATTENTION,
            },
        ),
        ("auto", None),
    ],
)
def test_backend_selects_the_sdpa_kernels_it_names(monkeypatch, backend, kernels) -> None:
    """model.attention.backend is real: 'flash' allows only FlashAttention, 'sdpa' only fused
    kernels (never the math fallback), 'auto' leaves torch's choice alone; same output."""
    import torch.nn.functional as F
    from torch.nn.attention import _cur_sdpa_kernel_backends

    seen = []
    real = F.scaled_dot_product_attention

    def spy(*a, **kw):
        seen.append(set(_cur_sdpa_kernel_backends()))
        return real(*a, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    q, k, v = _qkv(Hkv=4, Tq=6, Tk=6)
    ctx = ScoreContext(None, True)
    out, _ = AttentionCore(8, backend=backend)(q.float(), k.float(), v.float(), ctx)
    ref, _ = AttentionCore(8, backend="math")(q.float(), k.float(), v.float(), ctx)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    if kernels is None:
        assert SDPBackend.MATH in seen[0]  # torch's default set, untouched
    else:
        assert seen == [kernels]
