"""The LM head and its cross-entropy in one pass over row chunks, without the [N, V] logits.

loss = (1/M) sum_{n: t_n != ignore} (logsumexp_v z_nv - z_{n,t_n}),  z = h W^T,  M = #targets.
dloss/dz = (softmax(z) - onehot(t)) / M on target rows, 0 elsewhere; dh = dz W, dW = dz^T h.

Forward and backward happen in the forward call, chunk by chunk: per chunk one matmul for z, one
log-softmax, one exp for the probabilities, and the two gradient matmuls. The full logits and
their gradient ([N, V] each, 1.6 GB in fp32 for GPT-2 at batch 8 x 1024) never exist at once, and
the elementwise passes drop from five over [N, V] (log-softmax forward and backward, the
nll_loss gradient's zero fill and scatter) to about three over one chunk that stays in cache.
Same FLOPs as ``F.cross_entropy(h @ W^T)`` forward + backward (6 N d V); the backward pass only
scales the stored gradients by dloss. Measured for N=2048, d=256, V=4096 on the 2-core CPU:
93-100 ms vs 124-139 ms for the logits + ``F.cross_entropy`` path (benchmarks/FINDINGS.md §11).

Without autograd (evaluation) only the loss is computed, chunk by chunk. Matmuls run in the
autocast dtype when autocast is on (bf16 on CUDA), the softmax in float32.

Under ``torch.compile`` dynamo traces the autograd Function (forward with its in-forward gradients,
and backward): the chunk loop unrolls, inductor fuses each chunk's log-softmax / exp / scatter, and
the largest buffer stays one chunk of logits (tests/model/test_linear_cross_entropy.py checks the
generated code).

Kernels (``ATTNLAB_LOSS_KERNEL``, read at import; ``kernel=`` per call):

- ``chunked``: the pure-torch Function here, on any device;
- ``liger``: Liger Kernel's fused linear cross-entropy (Triton; extra ``attnlab[kernels]``), CUDA
  only. It also chunks rows and computes gradients in the forward; it syncs once per call
  (``.item()`` of the target count), which is a graph break under ``torch.compile``;
- ``cce``: Apple's cut-cross-entropy (Triton), CUDA only, called with ``filter_eps=None`` (its
  default skips small gradient entries, which would change the gradients). Its kernels accumulate
  with atomics, so it is refused in deterministic mode;
- ``auto`` (default): ``liger`` for fp32/bf16/fp16 on CUDA when it is installed, else ``chunked``.

Which is fastest on a given GPU is a measurement (``benchmarks/gpu_h100.sh``), not a claim.
"""

from __future__ import annotations

import importlib.util
import os

import torch
from torch import Tensor

from attnlab.base.errors import UserError

KERNEL_ENV = "ATTNLAB_LOSS_KERNEL"
KERNELS = ("auto", "chunked", "liger", "cce")
#: the process-wide choice; a module global, so torch.compile reads it as a guarded constant
KERNEL = os.environ.get(KERNEL_ENV, "auto")
#: the importable module of each library kernel
KERNEL_MODULES = {"liger": "liger_kernel", "cce": "cut_cross_entropy"}

#: logits per chunk (rows x vocabulary): 4 MB of fp32 on CPU (stays in L2/L3), 256 MB on GPUs
CHUNK_ELEMENTS = {"cpu": 1 << 20}
CHUNK_ELEMENTS_DEFAULT = 1 << 26


def chunk_rows(vocab: int, device: torch.device) -> int:
    per = CHUNK_ELEMENTS.get(device.type, CHUNK_ELEMENTS_DEFAULT)
    return max(1, per // vocab)


def _compute_dtype(h: Tensor) -> torch.dtype:
    dev = h.device.type
    if torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return h.dtype


def _wide(dtype: torch.dtype) -> torch.dtype:
    """The softmax and accumulation dtype: float32, or wider (float64 stays float64)."""
    return torch.promote_types(dtype, torch.float32)


def _chunks(h: Tensor, w: Tensor, targets: Tensor, ignore_index: int, rows: int, dtype):
    """Per chunk of rows: (rows slice, h chunk in dtype, safe targets [r, 1], valid [r],
    log-probabilities [r, V] in float32 or wider). Call with autocast off."""
    valid = targets != ignore_index
    safe = torch.where(valid, targets, 0)[:, None]
    for s in range(0, h.shape[0], rows):
        sl = slice(s, s + rows)
        hc = h[sl].to(dtype)
        z = hc @ w.t()
        yield sl, hc, safe[sl], valid[sl], torch.log_softmax(z.to(_wide(z.dtype)), dim=-1)


def _nll(logprobs: Tensor, safe: Tensor, valid: Tensor) -> Tensor:
    """Summed negative log-likelihood of the valid rows' targets."""
    return -(logprobs.gather(1, safe)[:, 0] * valid).sum()


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, targets, ignore_index, rows, dtype):  # type: ignore[override]
        with torch.autocast(h.device.type, enabled=False):
            w = weight.to(dtype)
            need_w = ctx.needs_input_grad[1]
            grad_h = torch.empty_like(h)
            acc = _wide(dtype)
            grad_w = torch.zeros_like(weight, dtype=acc)
            total = torch.zeros((), dtype=acc, device=h.device)
            for sl, hc, tc, vc, g in _chunks(h, w, targets, ignore_index, rows, dtype):
                total += _nll(g, tc, vc)
                g.exp_().scatter_add_(1, tc, -vc[:, None].to(g.dtype))  # softmax - onehot
                g.mul_(vc[:, None])  # ignored rows get no gradient
                g = g.to(dtype)
                grad_h[sl] = g @ w
                if not need_w:
                    continue
                if dtype == acc:
                    grad_w.addmm_(g.t(), hc)
                else:  # as autocast's backward: the product in dtype, accumulated in float32
                    grad_w += (g.t() @ hc).to(acc)
        count = (targets != ignore_index).sum()
        ctx.save_for_backward(grad_h, grad_w.to(weight.dtype), count)
        return total / count

    @staticmethod
    def backward(ctx, grad_loss):  # type: ignore[override]
        grad_h, grad_w, count = ctx.saved_tensors
        scale = grad_loss / count
        return grad_h * scale.to(grad_h.dtype), grad_w * scale.to(grad_w.dtype), *([None] * 4)


#: whether each library can be imported, looked up once at import (no import, no Triton load);
#: a constant for torch.compile, where a call to importlib would break the graph
INSTALLED = {k: importlib.util.find_spec(m) is not None for k, m in KERNEL_MODULES.items()}


def resolve_kernel(kernel: str, device: torch.device, dtype: torch.dtype) -> str:
    """The kernel that runs for ``kernel`` (see the module docstring), or a UserError naming why
    an explicitly chosen one cannot."""
    if kernel not in KERNELS:
        raise UserError(
            f"{KERNEL_ENV}={kernel!r} is not a loss kernel; choose one of {', '.join(KERNELS)}"
        )
    if kernel == "auto":
        fits = device.type == "cuda" and dtype in (torch.float32, torch.bfloat16, torch.float16)
        return "liger" if fits and INSTALLED["liger"] else "chunked"
    if kernel == "chunked":
        return kernel
    if device.type != "cuda":
        raise UserError(
            f"loss kernel {kernel!r} runs on CUDA only; use chunked or auto on {device}"
        )
    if not INSTALLED[kernel]:
        raise UserError(
            f"loss kernel {kernel!r} needs the {KERNEL_MODULES[kernel]} package: "
            "pip install 'attnlab[kernels]', or use chunked or auto"
        )
    if kernel == "cce" and torch.are_deterministic_algorithms_enabled():
        raise UserError(
            "loss kernel 'cce' accumulates with atomics and is not deterministic; "
            "use liger, chunked or auto with train.deterministic"
        )
    return kernel


def _liger(h2: Tensor, weight: Tensor, t: Tensor, ignore_index: int) -> Tensor:
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    return liger_fused_linear_cross_entropy(
        h2, weight, t, ignore_index=ignore_index, reduction="mean"
    )


def _cce(h2: Tensor, weight: Tensor, t: Tensor, ignore_index: int, dtype: torch.dtype) -> Tensor:
    from cut_cross_entropy import linear_cross_entropy as cce_loss

    with torch.autocast(h2.device.type, enabled=False):  # CCE reads its inputs' dtype
        loss = cce_loss(
            h2.to(dtype),
            weight.to(dtype),
            t,
            ignore_index=ignore_index,
            reduction="mean",
            filter_eps=None,
            impl="cce",
        )
    return loss.float()


def linear_cross_entropy(
    h: Tensor,
    weight: Tensor,
    targets: Tensor,
    *,
    ignore_index: int = -100,
    kernel: str | None = None,
) -> Tensor:
    """Mean cross-entropy of ``h [..., d] @ weight[V, d]^T`` against ``targets [...]`` (entries
    equal to ``ignore_index`` skipped); equals ``F.cross_entropy(h @ weight.T, targets)``.
    ``kernel`` overrides :data:`KERNEL` (``ATTNLAB_LOSS_KERNEL``) for this call."""
    h2, t = h.reshape(-1, h.shape[-1]), targets.reshape(-1)
    dtype = _compute_dtype(h)
    chosen = resolve_kernel(kernel or KERNEL, h.device, dtype)
    if chosen == "liger":
        return _liger(h2, weight, t, ignore_index)
    if chosen == "cce":
        return _cce(h2, weight, t, ignore_index, dtype)
    rows = chunk_rows(weight.shape[0], h.device)
    if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
        return _LinearCrossEntropy.apply(h2, weight, t, ignore_index, rows, dtype)
    with torch.autocast(h.device.type, enabled=False):
        chunks = _chunks(h2, weight.to(dtype), t, ignore_index, rows, dtype)
        total = sum(_nll(lp, tc, vc) for _, _, tc, vc, lp in chunks)
    return total / (t != ignore_index).sum()
