"""Injection into tiny random GPT-NeoX (parallel residual, partial rotary), Llama (GQA) and GPT-2
(fused Conv1D qkv): equivalence at zero, exact removal, and where each part acts."""

from __future__ import annotations

import pytest
import torch

from attnlab.base.errors import UserError
from attnlab.probe.arch import SPECS, Dims, arch_of
from attnlab.probe.inject import inject, injected_count
from attnlab.probe.methods import parse_method
from tests.helpers.probe_doubles import KINDS, tiny_model

torch.set_num_threads(1)
FULL = "preproj+skip+anchored-query"
NORM = {"gpt_neox": "input_layernorm", "llama": "input_layernorm", "gpt2": "ln_1"}


def _ids(tok, n: int = 2) -> torch.Tensor:
    text = "Attention reads queries, keys and values; the content skip goes around it."
    ids = tok.encode(text)[:24]
    return torch.tensor([ids] * n)


@torch.no_grad()
def _logits(model, ids):
    return model(input_ids=ids).logits


def _zero_outputs(inj) -> None:
    with torch.no_grad():
        for layer in inj.layers:
            if layer.feature_map is not None:
                layer.feature_map.w_down.weight.zero_()
            if layer.side_branch is not None:
                layer.side_branch.w_skip.weight.zero_()


@pytest.mark.parametrize("kind", KINDS)
def test_zeroed_parts_reproduce_the_base_and_each_part_is_live(kind):
    model, tok = tiny_model(kind)
    ids = _ids(tok)
    base = _logits(model, ids)
    inj = inject(model, FULL)
    layer = inj.layers[0]
    assert not layer.query.f.ln.weight.any()  # anchored f starts at exactly 0
    _zero_outputs(inj)
    torch.testing.assert_close(_logits(model, ids), base, atol=1e-5, rtol=0)
    # each part, switched on alone, changes the output (its hook is on the forward path)
    for part in (
        "feature_map.w_down.weight",
        "side_branch.w_skip.weight",
        "query.f.ln.weight",
    ):
        p = layer.get_parameter(part)
        with torch.no_grad():
            p.normal_(0, 0.5)
        assert (_logits(model, ids) - base).abs().max() > 1e-6, part
        with torch.no_grad():
            p.zero_()
    torch.testing.assert_close(_logits(model, ids), base, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_remove_restores_the_base_exactly(kind):
    model, tok = tiny_model(kind)
    ids = _ids(tok)
    base = _logits(model, ids)
    with inject(model, FULL) as inj:
        assert inj.active and hasattr(model, "attnlab_probe")
        assert not torch.equal(_logits(model, ids), base)
    assert not hasattr(model, "attnlab_probe")
    assert torch.equal(_logits(model, ids), base)
    assert {n for n, _ in model.named_parameters() if "attnlab" in n} == set()


def _capture(module, store, key):
    def hook(mod, args, kwargs, output):
        x = args[0] if args else kwargs["hidden_states"]
        store[key] = (x.detach().clone(), output)

    return module.register_forward_hook(hook, with_kwargs=True)


@pytest.mark.parametrize("kind", KINDS)
def test_pre_projection_feeds_q_k_v_and_anchored_f_touches_only_q(kind):
    model, tok = tiny_model(kind)
    spec, ids = arch_of(model), _ids(tok)
    block = spec.layer_list(model)[0]  # its input (the embeddings) does not change
    attn = spec.attention_of(block)
    q_mod = getattr(attn, spec.q_module)
    seen: dict = {}
    h_norm = _capture(getattr(block, NORM[kind]), seen, "norm")
    h_q = _capture(q_mod, seen, "q0")
    _logits(model, ids)
    h_q.remove()
    x_hat, qkv0 = seen["norm"][1].detach(), seen["q0"][1].detach()

    inj = inject(model, FULL)
    layer = inj.layers[0]
    with torch.no_grad():
        layer.query.f.ln.weight.normal_(0, 1.0)
        layer.query.f.ln.bias.normal_(0, 1.0)
        layer.feature_map.w_down.weight.zero_()
    h_q = _capture(q_mod, seen, "q1")  # registered after the anchored hook: sees its result
    _logits(model, ids)
    u, qkv1 = seen["q1"][0], seen["q1"][1].detach()
    torch.testing.assert_close(u, x_hat)  # with W_down = 0, x~ = x^
    f = layer.query.f(u)
    d, H = qkv0.shape[-1], model.config.num_attention_heads
    if kind == "gpt_neox":  # [..., H, 3 d_h] = per head [q_h | k_h | v_h]
        a, b = qkv0.view(*qkv0.shape[:-1], H, -1), qkv1.view(*qkv1.shape[:-1], H, -1)
        hd = a.shape[-1] // 3
        torch.testing.assert_close(b[..., hd:], a[..., hd:], atol=0, rtol=0)
        torch.testing.assert_close(b[..., :hd], a[..., :hd] + f.view(*f.shape[:-1], H, hd))
    elif kind == "gpt2":  # [q | k | v]
        dq = d // 3
        torch.testing.assert_close(qkv1[..., dq:], qkv0[..., dq:], atol=0, rtol=0)
        torch.testing.assert_close(qkv1[..., :dq], qkv0[..., :dq] + f)
    else:
        torch.testing.assert_close(qkv1, qkv0 + f)

    with torch.no_grad():  # now a live pre-projection: the q/k/v projection reads x~ != x^
        layer.feature_map.w_down.weight.normal_(0, 0.3)
    _logits(model, ids)
    torch.testing.assert_close(seen["q1"][0], layer.x_tilde(x_hat))
    assert (seen["q1"][0] - x_hat).abs().max() > 1e-3
    h_q.remove()
    h_norm.remove()


@pytest.mark.parametrize("kind", KINDS)
def test_content_skip_adds_w_skip_x_tilde_to_the_attention_branch(kind):
    model, tok = tiny_model(kind)
    spec, ids = arch_of(model), _ids(tok)
    attn = spec.attention_of(spec.layer_list(model)[0])
    inj = inject(model, "preproj+skip")
    layer = inj.layers[0]
    with torch.no_grad():
        layer.feature_map.w_down.weight.normal_(0, 0.3)
    seen: dict = {}
    q_mod = getattr(attn, spec.q_module)
    _capture(q_mod, seen, "q")
    _capture(attn, seen, "attn")
    with torch.no_grad():
        w = layer.side_branch.w_skip.weight.clone()
        layer.side_branch.w_skip.weight.zero_()
        _logits(model, ids)
        without = seen["attn"][1][0].clone()
        layer.side_branch.w_skip.weight.copy_(w.normal_(0, 0.5))
        _logits(model, ids)
    x_tilde = seen["q"][0]
    torch.testing.assert_close(seen["attn"][1][0] - without, x_tilde @ w.T, atol=1e-5, rtol=1e-5)


def test_pythia_parallel_residual_skip_joins_x_plus_attn_plus_mlp():
    """In a parallel block the MLP reads Norm2(x), not the attention branch, so a term added to
    the attention output is exactly ``x + attn + mlp + W_skip x~``."""
    model, tok = tiny_model("gpt_neox")
    assert model.config.use_parallel_residual
    spec, ids = arch_of(model), _ids(tok)
    block = spec.layer_list(model)[0]
    seen: dict = {}
    _capture(block.input_layernorm, seen, "norm")
    _capture(block, seen, "block0")
    _logits(model, ids)
    out0 = seen["block0"][1]
    out0 = (out0[0] if isinstance(out0, tuple) else out0).detach().clone()
    inj = inject(model, "skip")  # no pre-projection: x~ = x^
    with torch.no_grad():
        w = inj.layers[0].side_branch.w_skip.weight.normal_(0, 0.5).clone()
    _logits(model, ids)
    out1 = seen["block0"][1]
    out1 = out1[0] if isinstance(out1, tuple) else out1
    torch.testing.assert_close(out1 - out0, seen["norm"][1] @ w.T, atol=1e-5, rtol=1e-5)


@pytest.mark.fast
def test_injected_counts_are_exact_and_reproduce_seed_table_1():
    model, _ = tiny_model("llama")
    d = 32
    inj = inject(model, FULL)
    per_layer = 2 * round(1.25 * d) * d + d * d + (d + 2 * d * (d // 2) + 2 * d)
    assert inj.num_parameters() == 2 * per_layer
    assert injected_count(inj.dims, parse_method(FULL)) == inj.num_parameters()
    # seed 000, Table 1 (Pythia shapes): 160M pre-proj 17.7M, skip 7.1M, total 24.8M; 410M 62.9M
    p160 = Dims(d_model=768, n_heads=12, n_kv_heads=12, head_dim=64, n_layers=12, pretrained=True)
    p410 = Dims(d_model=1024, n_heads=16, n_kv_heads=16, head_dim=64, n_layers=24, pretrained=True)
    count = injected_count
    assert round(count(p160, parse_method("preproj")) / 1e6, 1) == 17.7
    assert round(count(p160, parse_method("skip")) / 1e6, 1) == 7.1
    assert round(count(p160, parse_method("preproj+skip")) / 1e6, 1) == 24.8
    assert round(count(p410, parse_method("preproj")) / 1e6, 1) == 62.9
    assert round(count(p410, parse_method("preproj+skip")) / 1e6, 1) == 88.1


def test_refusals_are_user_errors():
    model, _ = tiny_model("gpt2")
    inject(model, "skip")
    with pytest.raises(UserError, match="already carries"):
        inject(model, "skip")
    model.config.model_type = "bert"
    with pytest.raises(UserError, match="supported: " + ", ".join(sorted(SPECS))):
        arch_of(model)


@pytest.mark.parametrize("kind", KINDS)
def test_cached_decoding_matches_uncached_with_live_parts(kind):
    """The hooks act per token, so the base's own K/V cache stays valid (same shapes, no extra
    state): greedy decoding with and without the cache agrees."""
    model, tok = tiny_model(kind)
    inj = inject(model, FULL)
    with torch.no_grad():
        for layer in inj.layers:
            for p in layer.parameters():
                p.normal_(0, 0.2)
    ids = _ids(tok, 1)[:, :8]
    kw = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    cached = model.generate(ids, use_cache=True, **kw)
    uncached = model.generate(ids, use_cache=False, **kw)
    assert torch.equal(cached, uncached)
