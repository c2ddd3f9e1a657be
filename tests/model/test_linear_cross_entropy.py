"""Chunked LM head + cross-entropy (model/linear_cross_entropy.py) = logits + F.cross_entropy."""

from __future__ import annotations

import math
import re
import sys
import types

import pytest
import torch
import torch.nn.functional as F

import attnlab.model.linear_cross_entropy as lce
from attnlab.base.errors import UserError
from attnlab.model import build_model
from attnlab.model.linear_cross_entropy import linear_cross_entropy
from tests.helpers.model import tiny

pytestmark = pytest.mark.usefixtures("float64")


def _reference(h, w, t):
    return F.cross_entropy((h @ w.t()).reshape(-1, w.shape[0]), t.reshape(-1), ignore_index=-100)


@pytest.mark.parametrize("chunk", [1, 7, 64, 10_000])
@pytest.mark.parametrize("ignored", [0.0, 0.4])
def test_loss_and_gradients_equal_the_logits_path(
    monkeypatch: pytest.MonkeyPatch, chunk: int, ignored: float
) -> None:
    monkeypatch.setitem(lce.CHUNK_ELEMENTS, "cpu", chunk * 50)  # rows per chunk = chunk
    h = torch.randn(3, 9, 16, requires_grad=True)
    w = torch.randn(50, 16, requires_grad=True)
    t = torch.randint(0, 50, (3, 9))
    t[torch.rand(3, 9) < ignored] = -100
    got = linear_cross_entropy(h, w, t)
    (gh, gw) = torch.autograd.grad(2.5 * got, (h, w))
    ref = _reference(h, w, t)
    (rh, rw) = torch.autograd.grad(2.5 * ref, (h, w))
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(gh, rh, rtol=0, atol=1e-12)
    torch.testing.assert_close(gw, rw, rtol=0, atol=1e-12)
    assert torch.all(gh[t == -100] == 0)  # ignored rows get no gradient


def test_without_autograd_only_the_loss_is_computed() -> None:
    h, w = torch.randn(20, 8), torch.randn(30, 8)
    t = torch.randint(0, 30, (20,))
    with torch.no_grad():
        got = linear_cross_entropy(h, w, t)
    torch.testing.assert_close(got, _reference(h, w, t), rtol=0, atol=1e-12)


def test_frozen_weight_gets_no_gradient_and_h_still_does() -> None:
    h = torch.randn(6, 8, requires_grad=True)
    w = torch.randn(30, 8)
    t = torch.randint(0, 30, (6,))
    (gh,) = torch.autograd.grad(linear_cross_entropy(h, w, t), (h,))
    (rh,) = torch.autograd.grad(_reference(h, w, t), (h,))
    torch.testing.assert_close(gh, rh, rtol=0, atol=1e-12)


def test_bf16_autocast_matches_the_autocast_logits_path() -> None:
    h = torch.randn(40, 32, dtype=torch.float32, requires_grad=True)
    w = torch.randn(64, 32, dtype=torch.float32, requires_grad=True)
    t = torch.randint(0, 64, (40,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = linear_cross_entropy(h, w, t)
        ref = F.cross_entropy((h @ w.t()).float(), t)
    assert got.dtype == torch.float32
    gh, gw = torch.autograd.grad(got, (h, w))
    rh, rw = torch.autograd.grad(ref, (h, w))
    assert gh.dtype == h.dtype and gw.dtype == w.dtype
    torch.testing.assert_close(got, ref, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(gh, rh, rtol=5e-2, atol=5e-3)
    torch.testing.assert_close(gw, rw, rtol=5e-2, atol=5e-3)


@pytest.mark.parametrize(
    "flags",
    [
        [],
        ["model.tie_embeddings=false"],
        ["model.family=encoder", "model.mask.kind=full"],
        ["model.value.kind=moe", "model.mlp=false"],
    ],
)
def test_model_loss_and_grads_are_the_same_with_return_logits_false(flags: list[str]) -> None:
    model = build_model(tiny(*flags))
    ids = torch.randint(0, 64, (2, 10))
    targets = torch.randint(0, 64, (2, 10))
    targets[:, ::3] = -100
    plain = model(ids, targets)
    g_plain = torch.autograd.grad(plain.loss, list(model.parameters()), allow_unused=True)
    fused = model(ids, targets, return_logits=False)
    g_fused = torch.autograd.grad(fused.loss, list(model.parameters()), allow_unused=True)
    assert fused.logits is None and plain.logits is not None
    torch.testing.assert_close(fused.loss, plain.loss, rtol=0, atol=1e-12)
    for a, b in zip(g_fused, g_plain, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


# ------------------------------------------------------------------------------ torch.compile


def _largest_buffer(codes: list[str]) -> int:
    """Elements of the largest buffer the inductor-generated code allocates."""
    sizes = [0]
    for code in codes:
        for shape in re.findall(r"empty_strided_cpu\(\(([^)]*)\)", code):
            dims = [int(x) for x in shape.replace(" ", "").split(",") if x]
            sizes.append(math.prod(dims))
    return max(sizes)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-6)])
def test_compiled_loss_and_gradients_equal_the_logits_path_without_full_logits(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, tol: float
) -> None:
    """Under torch.compile the chunked Function is traced, not bypassed: equal loss and gradients
    (ignored targets included), and no buffer of the generated code holds all N x V logits."""
    from torch._inductor.utils import run_and_get_code

    N, d, V, rows = 48, 16, 256, 16
    monkeypatch.setitem(lce.CHUNK_ELEMENTS, "cpu", rows * V)
    h = torch.randn(N, d, dtype=dtype, requires_grad=True)
    w = torch.randn(V, d, dtype=dtype, requires_grad=True)
    t = torch.randint(0, V, (N,))
    t[::5] = -100

    loss_fn = torch.compile(
        lambda h, w, t: linear_cross_entropy(h, w, t, kernel="chunked"), fullgraph=True
    )

    def step():
        loss = loss_fn(h, w, t)
        loss.backward()  # the backward graph is compiled here, inside run_and_get_code
        return loss.detach()

    torch._dynamo.reset()
    got, codes = run_and_get_code(step)
    gh, gw = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    ref = _reference(h, w, t)
    ref.backward()
    torch.testing.assert_close(got, ref, rtol=tol, atol=tol)
    torch.testing.assert_close(gh, h.grad, rtol=tol, atol=tol)
    torch.testing.assert_close(gw, w.grad, rtol=tol, atol=tol)
    assert rows * V <= _largest_buffer(codes) < N * V


def test_compiled_bf16_autocast_matches_the_autocast_logits_path() -> None:
    h = torch.randn(40, 32, dtype=torch.float32, requires_grad=True)
    w = torch.randn(64, 32, dtype=torch.float32, requires_grad=True)
    t = torch.randint(0, 64, (40,))
    t[:7] = -100

    def loss_fn(h, w, t):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return linear_cross_entropy(h, w, t, kernel="chunked")

    torch._dynamo.reset()
    got = torch.compile(loss_fn, fullgraph=True)(h, w, t)
    gh, gw = torch.autograd.grad(got, (h, w))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = F.cross_entropy((h @ w.t()).float(), t)
    rh, rw = torch.autograd.grad(ref, (h, w))
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, ref, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(gh, rh, rtol=5e-2, atol=5e-3)
    torch.testing.assert_close(gw, rw, rtol=5e-2, atol=5e-3)


# ----------------------------------------------------------------------------------- kernels


def test_auto_is_chunked_on_cpu_and_liger_on_cuda_only_when_installed(monkeypatch) -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setitem(lce.INSTALLED, "liger", True)
    assert lce.resolve_kernel("auto", cpu, torch.float32) == "chunked"
    assert lce.resolve_kernel("auto", cuda, torch.bfloat16) == "liger"
    assert lce.resolve_kernel("auto", cuda, torch.float64) == "chunked"  # no fp64 Triton path
    monkeypatch.setitem(lce.INSTALLED, "liger", False)
    assert lce.resolve_kernel("auto", cuda, torch.bfloat16) == "chunked"
    assert lce.resolve_kernel("chunked", cuda, torch.bfloat16) == "chunked"


@pytest.mark.parametrize(
    "kernel,device,installed,deterministic,fragment",
    [
        ("fused", "cpu", True, False, r"'fused' is not a loss kernel; choose one of auto, chunked"),
        ("liger", "cpu", True, False, r"'liger' runs on CUDA only"),
        (
            "cce",
            "cuda",
            False,
            False,
            r"cut_cross_entropy package: pip install 'attnlab\[kernels\]",
        ),
        ("cce", "cuda", True, True, r"'cce' accumulates with atomics"),
    ],
)
def test_an_unusable_kernel_choice_is_a_user_error(
    monkeypatch, kernel, device, installed, deterministic, fragment
) -> None:
    monkeypatch.setitem(lce.INSTALLED, "cce", installed)
    monkeypatch.setitem(lce.INSTALLED, "liger", installed)
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: deterministic)
    with pytest.raises(UserError, match=fragment):
        lce.resolve_kernel(kernel, torch.device(device), torch.bfloat16)


def test_library_adapters_pass_what_the_libraries_document(monkeypatch) -> None:
    """The call each adapter makes (a stand-in records it; the real kernels need CUDA and are
    compared with the logits path in test_gpu_model.py)."""
    calls = {}

    def liger_fused_linear_cross_entropy(h, w, t, **kw):
        calls["liger"] = (h.shape, w.shape, t.shape, kw)
        return _reference(h, w, t)

    def cce_linear_cross_entropy(h, w, t, **kw):
        calls["cce"] = (h.dtype, w.dtype, kw, torch.is_autocast_enabled("cpu"))
        return _reference(h, w, t)

    liger = types.ModuleType("liger_kernel.transformers.functional")
    liger.liger_fused_linear_cross_entropy = liger_fused_linear_cross_entropy
    cce = types.ModuleType("cut_cross_entropy")
    cce.linear_cross_entropy = cce_linear_cross_entropy
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers.functional", liger)
    monkeypatch.setitem(sys.modules, "cut_cross_entropy", cce)
    h, w = torch.randn(6, 8), torch.randn(30, 8)
    t = torch.tensor([1, 2, -100, 4, 5, 6])
    ref = _reference(h, w, t)
    torch.testing.assert_close(lce._liger(h, w, t, -100), ref)
    assert calls["liger"] == ((6, 8), (30, 8), (6,), {"ignore_index": -100, "reduction": "mean"})
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lce._cce(h, w, t, -100, torch.bfloat16)
    assert calls["cce"] == (
        torch.bfloat16,
        torch.bfloat16,
        {"ignore_index": -100, "reduction": "mean", "filter_eps": None, "impl": "cce"},
        False,
    )


def test_compiled_model_takes_the_chunked_path_and_matches_eager_logits(monkeypatch) -> None:
    """``Transformer.forward(..., return_logits=False)`` under torch.compile: the loss and every
    gradient equal the eager logits path, and the compiled graphs never hold [B*T, V] logits."""
    from torch._inductor.utils import run_and_get_code

    B, T, V = 4, 32, 256
    monkeypatch.setitem(lce.CHUNK_ELEMENTS, "cpu", 16 * V)
    model = build_model(tiny(f"model.vocab_size={V}", "data.seq_len=32"))
    ids = torch.randint(0, V, (B, T))
    targets = torch.randint(0, V, (B, T))
    targets[:, ::4] = -100
    compiled = torch.compile(model)

    def step():
        out = compiled(ids, targets, return_logits=False)
        out.loss.backward()
        return out

    torch._dynamo.reset()
    out, codes = run_and_get_code(step)
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    ref = model(ids, targets)
    ref.loss.backward()
    assert out.logits is None
    torch.testing.assert_close(out.loss, ref.loss, rtol=1e-10, atol=1e-10)
    for a, p in zip(got, model.parameters(), strict=True):
        torch.testing.assert_close(a, p.grad, rtol=1e-9, atol=1e-10)
    assert _largest_buffer(codes) < B * T * V
