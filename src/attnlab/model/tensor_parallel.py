"""Tensor parallelism: a model's plan assembled from its parts' plans, applied on a device mesh.

``parallelize(model, mesh)`` splits a built :class:`~attnlab.model.transformer.Transformer`
over the ranks of ``mesh`` (1-D, the ``tp`` dimension of a ``("dp", "tp")`` mesh) with torch's
``parallelize_module``, the way torchtitan's per-model plans do (Llama: W_Q, W_K, W_V and the
MLP's W_in colwise, W_O and W_out rowwise; the embedding rowwise over the vocabulary and the LM
head colwise, its logits gathered):

- each part's Linears take the style its ``tp_plan()`` declares (:mod:`attnlab.parts.tp`), its
  own tensors are split along the dimension it declares (``distribute_tensor``), and a part
  that cannot be split stays whole (replicated: every rank holds and computes it);
- every attention layer owns H/P heads and H_kv/P KV heads (:class:`~attnlab.model.tp_heads.
  HeadSplit`), so the KV cache holds the rank's heads only;
- the token embedding and the LM head split over the vocabulary when P divides it (tied: one
  weight, split once), else they stay whole.

Memory per rank: each split Linear 1/P of its weight and of its AdamW state; communication per
layer: one all-reduce of [B, T, d] after W_O and one after every rowwise Linear (the MLP), one
of the gradient of x~ backward. Sequence parallelism (torchtitan's ``SequenceParallel`` norms,
the residual stream split by position between the split matmuls, a reduce-scatter in place of
each all-reduce) is not built: it saves activation memory on long sequences, not weights. Gloo
in torch 2.13 would run it on CPU (checked 2026-11-27: DTensor's Partial -> Shard
redistribution, ``reduce_scatter_tensor`` and a SequenceParallel norm + colwise + rowwise block
on 2 processes all run), as it runs FSDP2's reduce-scatter on the ("dp", "tp") mesh.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)

from attnlab.base.errors import UserError
from attnlab.model.attention_layer import Attention
from attnlab.model.tp_heads import HeadSplit
from attnlab.parts import Part
from attnlab.parts.tp import TPPlan

#: the attention layer's slots whose parts run on the rank's heads
HEAD_SLOTS = ("query", "key", "value", "score", "readout", "mixer")


def style(name: str) -> ParallelStyle:
    """torch's ParallelStyle for a declared Linear style (``attnlab.parts.tp.STYLES``)."""
    if name == "colwise":
        return ColwiseParallel()
    if name == "rowwise":
        return RowwiseParallel()
    return RowwiseParallel(input_layouts=Replicate())  # rowwise_full_in


@dataclass
class TPReport:
    """What ``parallelize`` did: the mesh size and, per replicated part kind, why."""

    size: int
    whole: dict[str, str] = field(default_factory=dict)  # "slot.kind" -> reason
    split: list[str] = field(default_factory=list)  # "slot.kind" of the split parts

    def lines(self) -> list[str]:
        out = [f"tensor parallel over {self.size} ranks: split {', '.join(self.split) or '-'}"]
        out += [f"  whole on every rank: {name}: {why}" for name, why in self.whole.items()]
        return out


def check_tp(cfg, size: int) -> None:
    """Refuse a tensor-parallel size that does not divide the heads (the config's numbers)."""
    H, Hkv = cfg.attention.n_heads, cfg.n_kv_heads
    if size < 1:
        raise UserError(f"--tp {size}: give a positive number of ranks per model copy")
    if H % size or Hkv % size:
        raise UserError(
            f"--tp {size} does not divide the heads (model.attention.n_heads={H}, KV heads "
            f"{Hkv}): each rank owns n_heads/tp heads; use a --tp that divides both"
        )


def own_parameters(part: nn.Module) -> dict[str, nn.Parameter]:
    """Parameters of ``part`` that no nested part or attention layer holds (name -> tensor)."""
    inner = [n for n, m in part.named_modules() if n and isinstance(m, Part | Attention)]
    return {
        n: p for n, p in part.named_parameters() if not any(n.startswith(f"{i}.") for i in inner)
    }


def placed(part: Part, plan: TPPlan, size: int = 1) -> TPPlan:
    """``plan``, or a replicated one when it leaves one of the part's own tensors unplaced or
    splits a tensor dimension or a Linear's features that ``size`` ranks do not divide."""
    if not plan.split:
        return plan
    covered = {f"{n}.{p}" for n in plan.linears for p in ("weight", "bias")}
    covered |= set(plan.tensors) | set(plan.summed)
    own = own_parameters(part)
    loose = sorted(set(own) - covered)
    if loose:
        return TPPlan.whole(f"its plan leaves {', '.join(loose)} unplaced")
    for name, dim in plan.tensors.items():
        if name in own and own[name].shape[dim] % size:
            n = own[name].shape[dim]
            return TPPlan.whole(f"{name} splits along a dimension of {n}, not a multiple of {size}")
    modules = dict(part.named_modules())
    for name, how in plan.linears.items():
        lin = modules.get(name)
        n = getattr(lin, "out_features" if how == "colwise" else "in_features", size)
        if n % size:  # DTensor's Shard takes equal pieces from each rank's local tensor
            return TPPlan.whole(f"{name} splits {n} features, not a multiple of {size}")
    return plan


def apply_plan(part: Part, plan: TPPlan, mesh: DeviceMesh) -> None:
    """Split ``part``'s Linears and tensors over ``mesh`` as ``plan`` declares."""
    where = f"{part.slot}.{part.kind}"
    problems = plan.problems()
    modules = dict(part.named_modules())
    for name in plan.linears:
        if not isinstance(modules.get(name), nn.Linear):
            problems.append(f"{name!r} is not an nn.Linear of the part")
    params = dict(part.named_parameters())
    problems += [f"{n!r} is not a parameter of the part" for n in plan.tensors if n not in params]
    if problems:
        raise UserError(f"part {where}: its tp_plan() is invalid: " + "; ".join(problems))
    if plan.linears:
        parallelize_module(part, mesh, {n: style(s) for n, s in plan.linears.items()})
    for name, dim in plan.tensors.items():
        owner_name, _, leaf = name.rpartition(".")
        owner = modules[owner_name]
        tensor = distribute_tensor(params[name].data, mesh, [Shard(dim)])
        owner.register_parameter(
            leaf, nn.Parameter(tensor, requires_grad=params[name].requires_grad)
        )


def _split_attention(attn: Attention, mesh: DeviceMesh, report: TPReport) -> None:
    """Give ``attn`` the rank's heads: split its head-slot parts, mark the whole ones."""
    size = mesh.size()
    plans = {}
    for slot in HEAD_SLOTS:
        part = getattr(attn, slot)
        if part is not None:
            plans[slot] = _note(part, placed(part, part.tp_plan(), size), report)
    # the slots whose output covers every head (a whole part, or a split one summing inside)
    sums = ("query", "key", "value")
    whole = {s: not p.split or (p.whole_output and s in sums) for s, p in plans.items()}
    split = HeadSplit(mesh, size, whole["query"], whole["key"], whole["value"])
    split.score_whole = whole.get("score", False)
    split.heads_local = not split.score_whole or attn.heads_out % size == 0
    split.readout_whole = whole["readout"]
    o_local = split.heads_local and not split.readout_whole
    split.mixer_whole = whole["mixer"] or not o_local  # a split mixer reads the rank's columns
    if split.mixer_whole and plans["mixer"].split:
        report.whole[f"mixer.{attn.mixer.kind}"] = "its input (the readout's o) is whole"
    for slot, plan in plans.items():
        if plan.split and not (slot == "mixer" and split.mixer_whole):
            apply_plan(getattr(attn, slot), plan, mesh)
    attn.fused = False  # each part's rows are the rank's own: no concatenated matmul
    attn.H, attn.Hkv = attn.H // size, attn.Hkv // size
    attn.tp = split


def _note(part: Part, plan: TPPlan, report: TPReport) -> TPPlan:
    name = f"{part.slot}.{part.kind}"
    if plan.split and name not in report.split:
        report.split.append(name)
    elif not plan.split:
        report.whole.setdefault(name, plan.replicated)
    return plan


def _split_vocabulary(model: nn.Module, mesh: DeviceMesh, report: TPReport) -> None:
    """Embedding rowwise over the vocabulary (an all-reduce of the looked-up rows), LM head
    colwise with its logits gathered; one weight when they are tied."""
    vocab = model.embed.num_embeddings
    if vocab % mesh.size():
        report.whole["embeddings"] = f"vocab_size {vocab} is not a multiple of {mesh.size()}"
        return
    tied = model.lm_head.weight is model.embed.weight
    parallelize_module(model.embed, mesh, RowwiseParallel(input_layouts=Replicate()))
    parallelize_module(model.lm_head, mesh, ColwiseParallel(output_layouts=Replicate()))
    if tied:  # both are Shard(0) of the same [V, d] matrix: keep one parameter
        model.lm_head.weight = model.embed.weight


def parallelize(model: nn.Module, mesh: DeviceMesh) -> TPReport:
    """Split ``model`` (built, on its device) over the 1-D ``mesh`` in place; the report says
    which parts run split and which whole, and why. Raises UserError when the mesh size does
    not divide the heads or a part's plan is invalid."""
    size = mesh.size()
    check_tp(model.cfg, size)
    report = TPReport(size)
    in_heads: set[int] = set()
    for m in list(model.modules()):
        if isinstance(m, Attention):
            _split_attention(m, mesh, report)
            in_heads.update(id(getattr(m, s)) for s in HEAD_SLOTS)
    for m in list(model.modules()):
        if isinstance(m, Part) and id(m) not in in_heads:
            plan = _note(m, placed(m, m.tp_plan(), size), report)
            if plan.split:
                apply_plan(m, plan, mesh)
    _split_vocabulary(model, mesh, report)
    model.tp_size = size
    return report
