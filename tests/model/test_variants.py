"""Every causal variant leaks nothing from the future, and its KV-cache decoding equals the uncached
forward (logits of prefill + chunked + one-token steps, and greedy generate with and without the
cache). Weights are moved off their init first, so parts that start as identities or zeros (anchored
f, identity-head weights, virtual-head kernels, W_skip) really take part."""

from __future__ import annotations

import pytest
import torch

from attnlab.model import generate
from tests.helpers.model import bump, perturbed

pytestmark = pytest.mark.usefixtures("float64")

METHOD = ["model.feature_map.kind=pre_projection", "model.side_branch.kind=content_skip"]
PYTHIA = [
    "model.residual_kind=parallel",
    "model.bias=true",
    "model.tie_embeddings=false",
    "model.position.kind=rope",
    "model.position.rope_fraction=0.25",
]
NONLINEAR = ["model.query.kind=nonlinear"]
IDENTITY_HEAD = ["model.readout.kind=identity_head"]
VIRTUAL = ["model.score.kind=virtual_heads"]
SLIDING = ["model.mask.kind=sliding", "model.mask.window=3"]
MOE = [
    "model.n_layers=1",
    "model.mlp=false",
    "model.value.kind=moe",
    "model.value.n_experts=4",
    "model.value.top_k=2",
    "model.loops=3",
]

VARIANTS: dict[str, list[str]] = {
    "baseline": [],
    "bias": ["model.bias=true", "model.tie_embeddings=false"],
    "math_backend": ["model.attention.backend=math"],
    "nonlinear_query": NONLINEAR,
    "nonlinear_query_unfused": [*NONLINEAR, "model.attention.fuse_qkv=false"],
    "nonlinear_query_scale_form": [*NONLINEAR, "model.query.scale_form=true"],
    "nonlinear_query_relu2_rope": [
        *NONLINEAR,
        "model.query.activation=relu2",
        "model.position.kind=rope",
    ],
    "identity_query": ["model.query.kind=identity"],
    "anchored_query": ["model.query.kind=anchored"],
    "anchored_query_mean_gqa": [
        "model.query.kind=anchored",
        "model.query.mean=true",
        "model.attention.n_kv_heads=2",
    ],
    "preproj_skip": METHOD,
    "preproj_gated_skip": [*METHOD, "model.feature_map.gated=true"],
    "preproj_skip_pythia": [*PYTHIA, *METHOD],
    "learned": ["model.position.kind=learned"],
    "sinusoidal": ["model.position.kind=sinusoidal"],
    "no_position": ["model.position.kind=none"],
    "rope": ["model.position.kind=rope"],
    "rope_partial": ["model.position.kind=rope", "model.position.rope_fraction=0.5"],
    "alibi": ["model.position.kind=alibi"],
    "t5": [
        "model.position.kind=t5",
        "model.position.t5_buckets=8",
        "model.position.t5_max_distance=16",
    ],
    "identity_head_no_mlp_no_residual": [
        *IDENTITY_HEAD,
        "model.residual=false",
        "model.mlp=false",
        "model.mixer.kind=nonlinear",
    ],
    "identity_head_with_residual": IDENTITY_HEAD,
    "virtual_heads_logits": VIRTUAL,
    "virtual_heads_probs": [*VIRTUAL, "model.score.on=probs"],
    "virtual_heads_8_from_4_k2": [
        *VIRTUAL,
        "model.score.n_virtual=8",
        "model.score.kernel_size=2",
    ],
    "virtual_heads_alibi_identity_head": [*VIRTUAL, *IDENTITY_HEAD, "model.position.kind=alibi"],
    "gqa": ["model.attention.n_kv_heads=2"],
    "explicit_head_dim_gqa_rope": [
        "model.attention.head_dim=12",
        "model.attention.n_kv_heads=2",
        "model.position.kind=rope",
    ],
    "mqa": ["model.attention.n_kv_heads=1"],
    "gqa_nonlinear_rope": [*NONLINEAR, "model.attention.n_kv_heads=2", "model.position.kind=rope"],
    "parallel_residual": PYTHIA,
    "post_ln": ["model.norm_position=post"],
    "qk_norm": ["model.attention.qk_norm=true", "model.position.kind=rope"],
    "rmsnorm_swiglu": ["model.norm.kind=rmsnorm", "model.ffn.kind=swiglu"],
    "scalenorm_relu2": ["model.norm.kind=scalenorm", "model.ffn.kind=relu2"],
    "sliding": SLIDING,
    "sliding_alibi": [*SLIDING, "model.position.kind=alibi"],
    "sliding_virtual_probs": [*SLIDING, *VIRTUAL, "model.score.on=probs"],
    "local_global": [
        "model.mask.kind=local_global",
        "model.mask.window=2",
        "model.mask.global_every=4",
        "model.mask.n_global=1",
    ],
    "moe_values": MOE,
    "moe_values_nonlinear_query": [*MOE, *NONLINEAR],
}


# ------------------------------------------------------------------------------------ causality


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_no_future_leak(name: str) -> None:
    model = perturbed(*VARIANTS[name])
    T = 10
    ids = torch.randint(0, 64, (2, T))
    base = model(ids).logits
    for t in (2, 6, T - 1):
        out = model(bump(ids, t)).logits
        torch.testing.assert_close(out[:, :t], base[:, :t], atol=1e-12, rtol=0)
        assert not torch.allclose(out[:, t], base[:, t]), "perturbing token t must change output t"


def test_prefix_lm_is_causal_after_the_prefix_and_bidirectional_inside_it() -> None:
    model = perturbed("model.mask.kind=prefix", "model.mask.prefix_len=4")
    ids = torch.randint(0, 64, (1, 10))
    base = model(ids).logits
    for t in (4, 7, 9):
        out = model(bump(ids, t)).logits
        torch.testing.assert_close(out[:, :t], base[:, :t], atol=1e-12, rtol=0)
    out = model(bump(ids, 3)).logits  # a prefix token is seen by the whole prefix
    assert not torch.allclose(out[:, 0], base[:, 0])


def _one_layer(flags: list[str]):
    return perturbed("model.n_layers=1", *flags)


@pytest.mark.parametrize(
    "name", ["sliding", "sliding_alibi", "sliding_virtual_probs", "sliding_virtual_logits"]
)
def test_sliding_window_limits_context_through_one_layer(name: str) -> None:
    flags = VARIANTS.get(name, [*SLIDING, *VIRTUAL])
    model = _one_layer(flags)
    ids = torch.randint(0, 64, (1, 12))
    base = model(ids).logits
    i, W = 9, 3
    for j in range(i + 1):
        changed = not torch.allclose(model(bump(ids, j)).logits[:, i], base[:, i], atol=1e-12)
        assert changed == (j > i - W), (j, changed)  # only keys i-W+1 .. i reach query i


def test_local_global_window_plus_global_tokens() -> None:
    model = _one_layer(VARIANTS["local_global"])  # window 2, global: position 0 and every 4th
    ids = torch.randint(0, 64, (1, 12))
    base = model(ids).logits
    i = 10
    reach = {
        j for j in range(i + 1) if not torch.allclose(model(bump(ids, j)).logits[:, i], base[:, i])
    }
    assert reach == {0, 4, 8, 9, 10}


# ------------------------------------------------------------------------------------- KV cache


def _decode_with_cache(model, ids: torch.Tensor, steps: list[int], **kw) -> torch.Tensor:
    cache = model.new_cache(ids.shape[0], ids.shape[1], dtype=torch.float64)
    outs, pos = [], 0
    for n in steps:
        outs.append(model(ids[:, pos : pos + n], cache=cache, **kw).logits)
        pos += n
    assert pos == ids.shape[1] and cache.length == pos
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_cached_decoding_equals_the_full_forward(name: str) -> None:
    model = perturbed(*VARIANTS[name])
    assert model.supports_cache
    ids = torch.randint(0, 64, (2, 11))
    full = model(ids).logits
    inc = _decode_with_cache(model, ids, [4, 2, 1, 1, 1, 1, 1])  # prefill, a chunk, then tokens
    torch.testing.assert_close(inc, full, atol=1e-10, rtol=0)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_generate_with_and_without_cache_give_the_same_tokens(name: str) -> None:
    model = perturbed(*VARIANTS[name])
    prompt = torch.randint(0, 64, (2, 4))
    a = generate(model, prompt, 5, temperature=0.0, use_cache=True)
    b = generate(model, prompt, 5, temperature=0.0, use_cache=False)
    assert a.shape == (2, 9) and torch.equal(a[:, :4], prompt)
    assert torch.equal(a, b)


@pytest.mark.fast
def test_prefix_lm_cached_decoding_after_the_prefix() -> None:
    model = perturbed("model.mask.kind=prefix", "model.mask.prefix_len=4")
    ids = torch.randint(0, 64, (2, 10))
    inc = _decode_with_cache(model, ids, [5, 2, 1, 1, 1])  # the prefill covers the prefix
    torch.testing.assert_close(inc, model(ids).logits, atol=1e-10, rtol=0)


def test_universal_loop_caches_one_slot_per_loop() -> None:
    model = perturbed(*VARIANTS["moe_values"])
    cache = model.new_cache(1, 6, dtype=torch.float64)
    assert len(cache.k) == len(cache.v) == 3  # one layer, looped 3 times
    model(torch.randint(0, 64, (1, 4)), cache=cache)
    # each loop wrote its own keys: the slots differ
    assert not torch.allclose(cache.k[0][:, :, :4], cache.k[1][:, :, :4])


ENC_DEC = ["model.family=encoder_decoder", "model.n_decoder_layers=2"]


@pytest.mark.parametrize(
    "flags",
    [
        [],
        ["model.position.kind=t5", "model.position.t5_buckets=8"],
        ["model.position.kind=rope", *NONLINEAR],
        [*METHOD, "model.attention.n_kv_heads=2"],
    ],
    ids=["learned", "t5", "rope_nonlinear", "preproj_skip_gqa"],
)
def test_encoder_decoder_cached_decoding_and_generation(flags: list[str]) -> None:
    model = perturbed(*ENC_DEC, *flags)
    enc = torch.randint(0, 64, (2, 7))
    ids = torch.randint(0, 64, (2, 9))
    full = model(ids, encoder_input_ids=enc).logits
    cache = model.new_cache(2, 9, dtype=torch.float64)
    outs = [model(ids[:, :3], cache=cache, encoder_input_ids=enc).logits]
    assert len(cache.cross) == 2  # cross K/V of each decoder layer, computed once
    for t in range(3, 9):
        outs.append(model(ids[:, t : t + 1], cache=cache).logits)  # no encoder input needed
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-10, rtol=0)
    prompt = ids[:, :2]
    a = generate(model, prompt, 4, temperature=0.0, use_cache=True, encoder_input_ids=enc)
    b = generate(model, prompt, 4, temperature=0.0, use_cache=False, encoder_input_ids=enc)
    assert torch.equal(a, b)


def test_new_cache_follows_the_model_dtype() -> None:
    model = perturbed()
    cache = model.new_cache(1, 4)  # no dtype given: the model's (float64 here)
    model(torch.randint(0, 64, (1, 3)), cache=cache)
    assert cache.k[0].dtype == torch.float64
