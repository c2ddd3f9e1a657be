"""Sort-by-expert dispatch for routed experts, and the ways to run the expert blocks.

With N tokens routed to k experts each, slot s = n k + j holds token n's j-th choice e_s. Sorting
the slots by expert (stable) gives ``order`` (sorted position -> slot) and its inverse; then

    dispatch   x_sorted[i] = x[order[i] // k]            [N k, d], experts in consecutive blocks
    experts    y_sorted[i] = act(x_sorted[i] W1_e + b1_e) W2_e + b2_e    e = the block's expert
    combine    y[s] = y_sorted[inverse[s]]               [N k, d_out], back in slot order

Both moves are gathers, and so are their gradients (written out below instead of autograd's
scatter-add for ``index_select``/indexing, which runs one row at a time on CPU and with atomics
on CUDA): dx[n] = sum_j dx_sorted[inverse[n k + j]], dy_sorted[i] = dy[order[i]]. Cost: 2 N k d
and 2 N k d_out element copies forward, as many backward; no FLOPs.

Expert blocks (all exact and dropless; each one's output equals the per-token formula above):

- ``loop``: one matmul pair per expert on its block (a Python loop over E; the block sizes are
  read on the host). The stacked weights are split once with ``unbind``: indexing ``w[e]`` per
  expert would make autograd fill and add a full [E, ...] gradient per expert.
- ``grouped``: ``torch.nn.functional.grouped_mm`` with int32 offsets, one call per matrix
  (forward and backward), no host sync; float32/bfloat16 rows of a multiple of 16 bytes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable


class _Dispatch(torch.autograd.Function):
    """x [N, d] -> x[src] [N k, d] with src = order // k; grad: sum over each token's k slots."""

    @staticmethod
    def forward(x: Tensor, src: Tensor, inverse: Tensor, k: int) -> Tensor:
        return x.index_select(0, src)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        _, _, inverse, k = inputs
        ctx.save_for_backward(inverse)
        ctx.k = k

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        (inverse,) = ctx.saved_tensors
        g = grad.index_select(0, inverse)
        return g.view(-1, ctx.k, g.shape[-1]).sum(1), None, None, None


class _Permute(torch.autograd.Function):
    """y [M, d] -> y[index] for a permutation ``index`` with inverse ``back``; grad: g[back]."""

    @staticmethod
    def forward(y: Tensor, index: Tensor, back: Tensor) -> Tensor:
        return y.index_select(0, index)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(inputs[2])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        (back,) = ctx.saved_tensors
        return grad.index_select(0, back), None, None


def sort_by_expert(experts: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """experts [N, k] -> (order, inverse [N k] int64, expert of each sorted slot [N k])."""
    flat = experts.reshape(-1)
    expert_sorted, order = flat.sort(stable=True)
    inverse = torch.empty_like(order)
    inverse.scatter_(0, order, torch.arange(order.numel(), device=order.device))
    return order, inverse, expert_sorted


def dispatch(x: Tensor, order: Tensor, inverse: Tensor, k: int) -> Tensor:
    """x [N, d] -> x_sorted [N k, d] (row i = token order[i] // k)."""
    return _Dispatch.apply(x, torch.div(order, k, rounding_mode="floor"), inverse, k)


def combine(y_sorted: Tensor, order: Tensor, inverse: Tensor) -> Tensor:
    """y_sorted [N k, d_out] -> y [N k, d_out] in slot order (row s = y_sorted[inverse[s]])."""
    return _Permute.apply(y_sorted, inverse, order)


Act = Callable[[Tensor], Tensor]


def _bias(t: Tensor, b: Tensor | None) -> Tensor:
    return t if b is None else t + b


def experts_loop(
    x_sorted: Tensor,
    counts: Tensor,
    w_in: Tensor,
    b_in: Tensor | None,
    w_out: Tensor,
    b_out: Tensor | None,
    act: Act,
) -> Tensor:
    """One matmul pair per expert block (block sizes ``counts`` [E] read on the host)."""
    blocks = x_sorted.split(counts.tolist())
    w1, w2 = w_in.unbind(0), w_out.unbind(0)
    b1 = b_in.unbind(0) if b_in is not None else [None] * len(w1)
    b2 = b_out.unbind(0) if b_out is not None else [None] * len(w1)
    outs = [
        _bias(act(_bias(xs @ w1[e], b1[e])) @ w2[e], b2[e])
        for e, xs in enumerate(blocks)
        if xs.shape[0] > 0
    ]
    if not outs:
        return x_sorted.new_zeros(0, w_out.shape[-1])
    return torch.cat(outs) if len(outs) > 1 else outs[0]


def experts_grouped(
    x_sorted: Tensor,
    counts: Tensor,
    expert_sorted: Tensor,
    w_in: Tensor,
    b_in: Tensor | None,
    w_out: Tensor,
    b_out: Tensor | None,
    act: Act,
    dtype: torch.dtype,
) -> Tensor:
    """``F.grouped_mm`` over the blocks (offsets = cumulative ``counts``), in ``dtype``."""
    offs = counts.cumsum(0).to(torch.int32)
    hdn = F.grouped_mm(x_sorted.to(dtype), w_in.to(dtype), offs=offs)
    if b_in is not None:
        hdn = hdn + b_in.to(dtype)[expert_sorted]
    y = F.grouped_mm(act(hdn), w_out.to(dtype), offs=offs)
    if b_out is not None:
        y = y + b_out.to(dtype)[expert_sorted]
    return y
