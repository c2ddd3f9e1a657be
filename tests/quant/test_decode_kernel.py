"""attnlab.quant.decode_kernel: int8 weight-only decoding on CPU through the fused compiled
reduction, checked against a float64 recomputation from the stored int8 weights and scales, and
against torchao's own kernel through whole-model greedy decoding."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("torchao")

from attnlab.config import load_config
from attnlab.model import build_model, generate
from attnlab.model.linear import Linear, decode_layout
from attnlab.quant import get_scheme, quantizable_config, quantize_model
from attnlab.quant.decode_kernel import MIN_WEIGHTS, ROWS_MAX

# d_model 512: every block Linear has >= MIN_WEIGHTS weights, so each takes the kernel
_SETS = ["model.d_model=512", "model.vocab_size=512", "model.n_layers=1"]


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    cfg = quantizable_config(load_config("tiny", _SETS))
    full = build_model(cfg.model).eval()
    out = {"float32": full}
    for name in ("int8-weight", "int8-dynamic"):
        out[name] = copy.deepcopy(full)
        quantize_model(out[name], get_scheme(name))
    out["int8-weight-head"] = copy.deepcopy(full)
    quantize_model(out["int8-weight-head"], get_scheme("int8-weight"), tied_head=True)
    return out


def _quantized_linears(model):
    return {
        n: m for n, m in model.named_modules() if isinstance(m, Linear) and m.weight.numel() > 1
    }


def test_int8_weight_linears_decode_through_the_kernel_and_match_float64(models):
    model = models["int8-weight"]
    lin = model.decoder.blocks[0].ffn.w_in
    assert lin.weight.numel() >= MIN_WEIGHTS
    x = torch.randn(1, 1, lin.in_features)
    w = lin.weight
    ref = (x.double() @ w.qdata.double().t()) * w.scale.double().reshape(-1)
    with torch.inference_mode(), decode_layout(model):
        assert lin._kernel is not None
        y = lin(x)
        many = torch.randn(ROWS_MAX + 1, lin.in_features)
        assert lin._kernel(many, None) is None  # a prefill's rows take torchao's path
    assert lin._kernel is None  # dropped when the layout closes
    assert (y.double() - ref).abs().max() < 1e-5 * ref.abs().max()


def test_int8_dynamic_and_small_weights_keep_their_own_kernel(models):
    with torch.inference_mode(), decode_layout(models["int8-dynamic"]):
        assert not [n for n, m in _quantized_linears(models["int8-dynamic"]).items() if m._kernel]
    torch.manual_seed(0)
    small = build_model(quantizable_config(load_config("tiny")).model).eval()
    quantize_model(small, get_scheme("int8-weight"))
    with torch.inference_mode(), decode_layout(small):
        assert all(m._kernel is None for m in _quantized_linears(small).values())


@pytest.mark.parametrize("name", ["int8-weight", "int8-weight-head"])
def test_cached_greedy_decoding_with_the_kernel_equals_torchaos_kernel(models, name):
    model = models[name]
    prompt = torch.randint(0, 512, (1, 5), generator=torch.Generator().manual_seed(1))
    fast = generate(model, prompt, 12, temperature=0.0, use_cache=True)
    plain = generate(model, prompt, 12, temperature=0.0, use_cache=True, rows_layout=False)
    assert torch.equal(fast, plain)


def test_a_quantized_tied_head_decodes_through_the_kernel(models):
    """The LM head (d x vocab, the biggest matmul of decoding) takes the kernel when
    tied_head=True quantizes it; without it, it stays the float embedding's split layout."""
    with torch.inference_mode(), decode_layout(models["int8-weight-head"]):
        assert models["int8-weight-head"].lm_head._kernel is not None
    with torch.inference_mode(), decode_layout(models["int8-weight"]):
        assert models["int8-weight"].lm_head._kernel is None
