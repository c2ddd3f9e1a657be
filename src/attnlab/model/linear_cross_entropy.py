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
"""

from __future__ import annotations

import torch
from torch import Tensor

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


def linear_cross_entropy(
    h: Tensor, weight: Tensor, targets: Tensor, *, ignore_index: int = -100
) -> Tensor:
    """Mean cross-entropy of ``h [..., d] @ weight[V, d]^T`` against ``targets [...]`` (entries
    equal to ``ignore_index`` skipped); equals ``F.cross_entropy(h @ weight.T, targets)``."""
    h2, t = h.reshape(-1, h.shape[-1]), targets.reshape(-1)
    rows = chunk_rows(weight.shape[0], h.device)
    dtype = _compute_dtype(h)
    if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
        return _LinearCrossEntropy.apply(h2, weight, t, ignore_index, rows, dtype)
    with torch.autocast(h.device.type, enabled=False):
        chunks = _chunks(h2, weight.to(dtype), t, ignore_index, rows, dtype)
        total = sum(_nll(lp, tc, vc) for _, _, tc, vc, lp in chunks)
    return total / (t != ignore_index).sum()
