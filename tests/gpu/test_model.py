"""The model on CUDA, for every variant of the bench's list (attnlab.bench.variants): compiled vs
eager, bf16 autocast vs fp32, KV-cache decoding vs the uncached forward, and the chunked / library
losses vs the logits path, plus their peak memory under torch.compile.

Tolerances, all relative to the fp32 eager result with TF32 off:
- compiled vs eager, fp32: loss within 1e-5 relative, every gradient within 1e-4 in norm
  (inductor fuses and reorders reductions; fp32 rounding is ~1e-7 per op);
- bf16 autocast vs fp32: loss within 2e-2 relative, every gradient within 1e-1 in norm
  (bf16 keeps 8 mantissa bits, ~4e-3 relative per rounding, compounded over 2 layers);
- KV cache vs full forward, fp32: logits within 1e-4 absolute (different kernels for one query
  row than for T rows), identical greedy tokens;
- chunked / Liger / CCE loss vs logits path: fp32 loss within 1e-5, gradients 1e-4 in norm;
  under bf16 autocast 1e-2 and 2e-2.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.bench.variants import VARIANTS, variant_config
from attnlab.config import load_config
from attnlab.model import build_model, generate
from attnlab.model import linear_cross_entropy as lce
from tests.helpers.gpu import DEVICE, exact_fp32, needs_cuda, rel_err
from tests.helpers.model import TINY
from tests.model.test_variants import VARIANTS as CACHE_VARIANTS

pytestmark = pytest.mark.gpu

BASE = ["model.d_model=64", "model.n_layers=2", "model.attention.n_heads=4", "data.seq_len=64"]


@pytest.fixture(autouse=True)
def _exact():
    torch.manual_seed(0)
    with exact_fp32():
        yield


def _model(name: str) -> torch.nn.Module:
    """The variant at tiny size on DEVICE, weights moved off their init (so identity- or
    zero-initialised parts take part), in training mode (MoE aux losses included)."""
    cfg = variant_config(load_config("tiny", BASE), name).model
    torch.manual_seed(0)
    model = build_model(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.to(DEVICE).train()


def _batch(model, B: int = 4, T: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.cfg.vocab_size, (B, T), generator=g)
    targets = torch.randint(0, model.cfg.vocab_size, (B, T), generator=g)
    targets[:, ::7] = -100
    return ids.to(DEVICE), targets.to(DEVICE)


def _loss_and_grads(model, fwd, ids, targets, autocast: bool = False):
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16, enabled=autocast):
        out = fwd(ids, targets, return_logits=False)
        loss = out.loss + (out.aux_loss if out.aux_loss is not None else 0)
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return loss.detach().float(), grads


def _compare(got, ref, loss_tol: float, grad_tol: float) -> None:
    (la, ga), (lb, gb) = got, ref
    assert abs(float(la) - float(lb)) <= loss_tol * abs(float(lb)), (float(la), float(lb))
    for i, (a, b) in enumerate(zip(ga, gb, strict=True)):
        assert (a is None) == (b is None), i
        if a is not None and b.norm() > 0:
            assert rel_err(a, b) <= grad_tol, (i, rel_err(a, b))


@pytest.mark.parametrize("name", list(VARIANTS))
def test_compiled_equals_eager(name: str) -> None:
    model = _model(name)
    ids, targets = _batch(model)
    eager = _loss_and_grads(model, model, ids, targets)
    torch._dynamo.reset()
    compiled = _loss_and_grads(model, torch.compile(model), ids, targets)
    _compare(compiled, eager, 1e-5, 1e-4)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_bf16_autocast_is_close_to_fp32(name: str) -> None:
    model = _model(name)
    ids, targets = _batch(model)
    fp32 = _loss_and_grads(model, model, ids, targets)
    bf16 = _loss_and_grads(model, model, ids, targets, autocast=True)
    _compare(bf16, fp32, 2e-2, 1e-1)


@pytest.mark.parametrize("name", sorted(CACHE_VARIANTS))
def test_kv_cache_decoding_equals_the_uncached_forward(name: str) -> None:
    cfg = load_config(
        None,
        [*TINY, *CACHE_VARIANTS[name]],
    ).model
    torch.manual_seed(0)
    model = build_model(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model = model.to(DEVICE).eval()
    ids = torch.randint(0, 64, (2, 11), device=DEVICE)
    with torch.no_grad():
        full = model(ids).logits
        cache = model.new_cache(2, 11)
        steps, outs, pos = [4, 2, 1, 1, 1, 1, 1], [], 0
        for n in steps:
            outs.append(model(ids[:, pos : pos + n], cache=cache).logits)
            pos += n
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-4, rtol=0)
    prompt = ids[:, :4]
    a = generate(model, prompt, 6, temperature=0.0, use_cache=True)
    b = generate(model, prompt, 6, temperature=0.0, use_cache=False)
    assert torch.equal(a, b)


# ------------------------------------------------------------------------------------- the loss


def _loss_inputs(N: int, d: int, V: int, dtype=torch.float32):
    g = torch.Generator().manual_seed(2)
    h = (torch.randn(N, d, generator=g) * 0.5).to(DEVICE, dtype).requires_grad_()
    w = (torch.randn(V, d, generator=g) * 0.05).to(DEVICE, dtype).requires_grad_()
    t = torch.randint(0, V, (N,), generator=g).to(DEVICE)
    t[::9] = -100
    return h, w, t


def _kernel_or_skip(kernel: str) -> None:
    if kernel != "chunked" and (DEVICE.type != "cuda" or not lce.INSTALLED[kernel]):
        pytest.skip(f"loss kernel {kernel!r} needs CUDA and {lce.KERNEL_MODULES[kernel]}")


@pytest.mark.parametrize("kernel", ["chunked", "liger", "cce"])
@pytest.mark.parametrize("autocast", [False, True])
def test_loss_kernels_equal_the_logits_path(kernel: str, autocast: bool) -> None:
    """Several chunks of a GPT-2-sized vocabulary; ignored targets included."""
    _kernel_or_skip(kernel)
    h, w, t = _loss_inputs(3000, 128, 50257)
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16, enabled=autocast):
        got = lce.linear_cross_entropy(h, w, t, kernel=kernel)
        ref = F.cross_entropy((h @ w.t()).float(), t)
    gg = torch.autograd.grad(got, (h, w))
    rg = torch.autograd.grad(ref, (h, w))
    loss_tol, grad_tol = (1e-2, 2e-2) if autocast else (1e-5, 1e-4)
    _compare((got.detach(), gg), (ref.detach(), rg), loss_tol, grad_tol)


@needs_cuda
def test_compiled_training_step_never_holds_the_full_logits() -> None:
    """Peak CUDA memory of a compiled bf16 forward + backward: the chunked loss path stays below
    one [B*T, V] fp32 logits tensor, while the logits path holds at least the bf16 logits (so
    the measurement would see them)."""
    cfg = load_config(
        "tiny", ["model.d_model=128", "model.vocab_size=50304", "data.seq_len=256"]
    ).model
    model = build_model(cfg).to(DEVICE).train()
    compiled = torch.compile(model)
    B, T = 32, 256  # [B*T, V] fp32 = 1.65 GB; one chunk of the chunked path: 268 MB
    ids = torch.randint(0, cfg.vocab_size, (B, T), device=DEVICE)
    peaks = {}
    for return_logits in (True, False, True, False):  # second pass: after compilation
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = compiled(ids, ids, return_logits=return_logits).loss
        loss.backward()
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        peaks[return_logits] = torch.cuda.max_memory_allocated() - base
    full_logits = B * T * cfg.vocab_size * 4
    assert peaks[False] < full_logits < 2 * peaks[True], (peaks, full_logits)
