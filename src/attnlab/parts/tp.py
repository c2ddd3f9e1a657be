"""A part's tensor-parallel plan: how its weights split over the ranks of a ``tp`` mesh dimension.

Tensor parallelism (Megatron-LM, Shoeybi et al. 2019; torch's ``parallelize_module``) splits
each layer's matrices over P ranks so that each holds and multiplies 1/P of them:

- ``colwise``  y = x W^T with W's output rows split: rank r holds rows [r out/P, (r+1) out/P) and
  returns that slice of y (full x in, 1/P of y out; no communication forward, an all-reduce of
  dx backward);
- ``rowwise``  y = x W^T with W's input columns split: rank r multiplies its slice of x by its
  columns and the P partial products are summed (an all-reduce of y forward);
- ``rowwise_full_in``: ``rowwise`` on a full x, each rank reading its own slice of it (a single
  d x d Linear: the content skip).

A part declares which of its Linears take which style, which of its own tensors are split along
which dimension, or that it cannot be split (``replicated`` says why: every rank then holds it
whole and computes it whole, and the model still runs). Cost of the declaration: none; the
model's assembly (``attnlab.model.tensor_parallel``) applies it with ``parallelize_module``.

What "split" means per slot (the attention's heads follow the mesh: rank r of P owns heads
[r H/P, (r+1) H/P) and KV heads [r H_kv/P, (r+1) H_kv/P)):

- ``query``, ``key``, ``value``: a split part returns only its rank's heads (its Linears
  ``colwise``); a replicated one returns all heads and the attention keeps its rank's slice.
- ``score``: a split part is given its rank's heads and returns its rank's H'/P output heads; a
  replicated one (e.g. a mixing matrix over all heads) is given every head, gathered from the
  ranks, and its output heads are sliced again.
- ``readout``: a split part reads its rank's heads and returns its rank's columns of o (the
  concatenation); a replicated one reads every head.
- ``mixer``: a split part reads its rank's columns of o (``rowwise``) or all of them
  (``rowwise_full_in``) and returns the summed output.
- every other slot (feature map, side branch, FFN, norm, position): reads and returns the whole
  d-wide stream; its Linears pair ``colwise`` then ``rowwise`` (the MLP) or are
  ``rowwise_full_in``.

A part that splits its own work (an MoE's experts) reads its split tensors through ``local``,
sums its ranks' partial outputs with ``summed`` and the gradients of what it applies to its
rank's share with ``summed_grad`` (Megatron's reduce-from and copy-to regions; ``whole_output``
then says a projection returns every head).

A split part in the attention path must place every parameter it owns (a Linear's style or a
tensor's dimension); one that leaves a tensor unplaced is treated as replicated, with that
reason, because a replicated weight applied to one rank's heads would get only that rank's part
of its gradient.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.distributed
from torch import Tensor

LinearStyle = Literal["colwise", "rowwise", "rowwise_full_in"]
STYLES: tuple[str, ...] = ("colwise", "rowwise", "rowwise_full_in")

#: the reason given for a part that declares no plan
NO_PLAN = "declares no tensor-parallel plan: replicated on every rank"


@dataclass(frozen=True)
class TPPlan:
    """A part's tensor-parallel plan (``Part.tp_plan()``).

    ``linears``: Linear name relative to the part -> style (``STYLES``). ``tensors``: the part's
    own parameter name -> the dimension split over the ranks (a per-head tensor by its head
    dimension, stacked experts by the expert dimension). ``replicated``: why the part cannot be
    split (non-empty: it is held and computed whole on every rank; the other fields are then
    empty). ``summed``: own parameters kept whole on every rank that the part applies to its
    rank's share of the work and whose gradients it sums itself (reading them through
    :func:`summed_grad`: an MoE's router). ``whole_output``: a split projection (query, key,
    value) that returns every head, its ranks' shares summed inside it (:func:`summed`); the
    attention keeps the rank's heads, as of a whole part."""

    linears: Mapping[str, LinearStyle] = field(default_factory=dict)
    tensors: Mapping[str, int] = field(default_factory=dict)
    replicated: str = ""
    summed: tuple[str, ...] = ()
    whole_output: bool = False

    @property
    def split(self) -> bool:
        """Whether the part runs on its rank's share (False: whole on every rank)."""
        return not self.replicated

    @classmethod
    def whole(cls, why: str) -> TPPlan:
        """The plan of a part that cannot be split, with the reason shown in the TP report."""
        return cls(replicated=why)

    def problems(self) -> list[str]:
        """What is wrong with the plan itself (an unknown style; a replicated plan that also
        places tensors); empty: none."""
        out = [
            f"Linear {name!r} has style {style!r}; choose one of {', '.join(STYLES)}"
            for name, style in self.linears.items()
            if style not in STYLES
        ]
        if self.replicated and (self.linears or self.tensors or self.summed or self.whole_output):
            out.append("a replicated plan places no Linear or tensor")
        return out


def local(t: Tensor) -> Tensor:
    """A tensor as this rank holds it: the rank's shard of a tensor the plan split (a DTensor's
    ``to_local()``, its gradient flowing back to that shard), else the tensor itself. A part
    that splits its own tensors (``TPPlan.tensors``) reads them through this in ``forward``."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def is_split(t: Tensor) -> bool:
    """Whether ``t`` is a tensor the plan split over a mesh (a DTensor)."""
    return callable(getattr(t, "to_local", None)) and hasattr(t, "device_mesh")


def shard_range(t: Tensor) -> tuple[int, int]:
    """[lo, hi) of this rank's rows of ``t`` along its split dimension (the whole dimension 0
    when ``t`` is not split): rank r of P holds rows [r c, (r+1) c), c = ceil(n/P), cut at n
    (``torch.chunk``'s split, as DTensor's ``Shard``)."""
    if not is_split(t):
        return 0, t.shape[0]
    mesh = t.device_mesh
    dim = next(p.dim for p in t.placements if hasattr(p, "dim"))
    n, size, rank = t.shape[dim], mesh.size(), mesh.get_local_rank()
    c = -(-n // size)
    return min(rank * c, n), min((rank + 1) * c, n)


class _SumGrad(torch.autograd.Function):
    """Identity forward; the ranks' gradients summed backward (Megatron's copy-to-region)."""

    @staticmethod
    def forward(ctx, t: Tensor, group) -> Tensor:
        ctx.group = group
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad: Tensor):
        grad = grad.contiguous().clone()
        torch.distributed.all_reduce(grad, group=ctx.group)
        return grad, None


class _SumForward(torch.autograd.Function):
    """The ranks' values summed forward; the gradient passed on as it is (every rank's term
    of the sum has the sum's gradient): Megatron's reduce-from-region."""

    @staticmethod
    def forward(ctx, t: Tensor, group) -> Tensor:
        t = t.contiguous().clone()
        torch.distributed.all_reduce(t, group=group)
        return t

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad, None


def summed_grad(t: Tensor, like: Tensor) -> Tensor:
    """``t`` (the same on every rank) used for this rank's share of a part's work: the
    identity forward, the ranks' gradients summed backward, over the mesh of the split tensor
    ``like``; ``t`` itself when ``like`` is not split (one process)."""
    if not is_split(like):
        return t
    return _SumGrad.apply(t, like.device_mesh.get_group())


def summed(t: Tensor, like: Tensor) -> Tensor:
    """The sum over the ranks of ``like``'s mesh of each rank's partial ``t`` (its gradient
    passed to every rank's term); ``t`` itself when ``like`` is not split."""
    if not is_split(like):
        return t
    return _SumForward.apply(t, like.device_mesh.get_group())
