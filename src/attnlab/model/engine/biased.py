"""A learned float bias on SDPA's CPU flash kernel: the bias's gradient from dS, recomputed.

SDPA's CPU flash kernel takes a float mask but returns no gradient for it: a mask that requires
grad (T5's learned table) sends SDPA to its math path, which keeps the [B, H, Q, K] matrix for
backward (measured: T5 5.9x the causal baseline at T = 1024). Here the kernel runs forward and
backward with the bias detached, and the bias's own gradient comes from

    dS = P * (dO v^T - rowsum(dO * O)),   P = exp(scale q k^T + bias - lse)

recomputed in backward (the kernel's log-sum-exp is kept from forward), handed to the bias's own
graph, which ``make_bias`` rebuilds from the mods' parameters. Nothing of size Q K is kept
between forward and backward; dS lives for one stack. Cost: two more matmuls and one exp per
stack in backward.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

_fwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


class BiasedFlash(torch.autograd.Function):
    """out = softmax(scale q k^T + make_bias()) v with gradients for q, k, v and ``params``."""

    @staticmethod
    def forward(ctx, q, k, v, scale: float, make_bias: Callable[[], Tensor], *params):
        G = q.shape[1] // k.shape[1]
        kr, vr = (k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)) if G > 1 else (k, v)
        with torch.no_grad():
            mask = make_bias()
        out, lse = _fwd(q, kr, vr, 0.0, False, attn_mask=mask, scale=scale)
        ctx.save_for_backward(q, k, v, out, lse, *params)
        ctx.scale, ctx.make_bias, ctx.groups = scale, make_bias, G
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, *params = ctx.saved_tensors
        G = ctx.groups
        kr, vr = (k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)) if G > 1 else (k, v)
        with torch.enable_grad():
            bias = ctx.make_bias()
        mask = bias.detach()
        dout = dout.contiguous()
        dq, dk, dv = _bwd(dout, q, kr, vr, out, lse, 0.0, False, attn_mask=mask, scale=ctx.scale)
        if G > 1:
            dk = dk.unflatten(1, (-1, G)).sum(2)
            dv = dv.unflatten(1, (-1, G)).sum(2)
        lse = torch.where(torch.isinf(lse), 0.0, lse)  # a row with no key: P = 0, not nan
        p = torch.exp((q @ kr.transpose(-1, -2)) * ctx.scale + mask - lse[..., None])
        ds = p * (dout @ vr.transpose(-1, -2) - (dout * out).sum(-1, keepdim=True))
        dims = [i for i, (a, b) in enumerate(zip(bias.shape, ds.shape)) if a == 1 and b > 1]
        if dims:
            ds = ds.sum(dims, keepdim=True)
        grads = torch.autograd.grad(bias, params, ds, allow_unused=True)
        return (dq, dk, dv, None, None, *grads)


def biased_flash(
    q: Tensor, k: Tensor, v: Tensor, scale: float, make_bias: Callable[[], Tensor], params
) -> Tensor:
    """The fused call with a bias built (and rebuilt in backward) by ``make_bias`` from
    ``params`` (the leaf tensors its gradient flows to)."""
    return BiasedFlash.apply(
        q.contiguous(), k.contiguous(), v.contiguous(), scale, make_bias, *params
    )
