"""Process-group plumbing for ``torchrun``: rank/world discovery, the ("dp", "tp") device mesh,
tensor parallelism, DDP and FSDP2 wrapping.

One process is the degenerate case (rank 0 of 1) and needs no process group. Under ``torchrun`` the
group is created here (NCCL on CUDA, Gloo on CPU) unless the caller already made one, and destroyed
again by :meth:`Dist.close` only if it was created here, so ``train()`` can be called repeatedly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as tdist
from torch import nn

from attnlab.base.errors import UserError
from attnlab.runs.device import torchrun_local_rank


@dataclass
class Dist:
    """This process's place in the job: ``rank`` of ``world`` (``local_rank`` on its node)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    owns_group: bool = False
    backend: str | None = None
    #: ranks per model copy (``--tp``): each copy is split over ``tp`` consecutive ranks
    tp: int = 1
    #: the 2-D ("dp", "tp") mesh when ``tp`` > 1 (torch's ``init_device_mesh``), else None
    mesh: Any = None
    _closed: bool = field(default=False, repr=False)

    @property
    def data_world(self) -> int:
        """Model copies that read different batches (the "dp" size: world / tp)."""
        return self.world // self.tp

    @property
    def data_rank(self) -> int:
        """This rank's copy (its "dp" index): the ranks of one copy read the same batch."""
        return self.rank // self.tp

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    def describe(self, parallel: str) -> str:
        """status.json's ``parallel``: none, ddp, fsdp, tp, or fsdp+tp (copies x split)."""
        if self.tp > 1:
            return "fsdp+tp" if self.data_world > 1 else "tp"
        return parallel if self.enabled else "none"

    def barrier(self) -> None:
        if self.enabled:
            tdist.barrier()

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.enabled:
            return obj
        box = [obj]
        tdist.broadcast_object_list(box, src=0)
        return box[0]

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, indexed by rank."""
        if not self.enabled:
            return [obj]
        out: list[Any] = [None] * self.world
        tdist.all_gather_object(out, obj)
        return out

    def mean(self, t: torch.Tensor) -> torch.Tensor:
        """The average of ``t`` over ranks (in place)."""
        if self.enabled:
            tdist.all_reduce(t, op=tdist.ReduceOp.SUM)
            t /= self.world
        return t

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """The sum of ``t`` over ranks (in place)."""
        if self.enabled:
            tdist.all_reduce(t, op=tdist.ReduceOp.SUM)
        return t

    def close(self) -> None:
        if self.owns_group and not self._closed and tdist.is_initialized():
            tdist.destroy_process_group()
        self._closed = True


def setup(device_pref: str, tp: int = 1) -> Dist:
    """Join the ``torchrun`` job described by the environment, if any (WORLD_SIZE > 1); with
    ``tp`` > 1 also build the ("dp", "tp") mesh of world/tp copies of tp ranks each."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    check_tp_world(tp, world if world > 1 or not tdist.is_initialized() else tdist.get_world_size())
    dist = _join(device_pref, world)
    if tp > 1:
        from torch.distributed.device_mesh import init_device_mesh

        kind = "cuda" if dist.backend == "nccl" else "cpu"
        dist.tp = tp
        dist.mesh = init_device_mesh(kind, (dist.world // tp, tp), mesh_dim_names=("dp", "tp"))
    return dist


def check_tp_world(tp: int, world: int) -> None:
    """Refuse a ``--tp`` that the job's processes cannot hold."""
    if tp < 1:
        raise UserError(f"--tp {tp}: give the number of ranks each model copy is split over (>= 1)")
    if tp > 1 and world <= 1:
        raise UserError(
            f"--tp {tp} splits the model over {tp} processes, and this is one process; start it "
            f"under torchrun: torchrun --standalone --nproc_per_node={tp} -m attnlab ... --tp {tp}"
        )
    if world % tp:
        raise UserError(
            f"--tp {tp} does not divide the {world} processes torchrun started; use "
            f"--nproc_per_node a multiple of {tp} (world = data-parallel copies x tp)"
        )


def _join(device_pref: str, world: int) -> Dist:
    if world <= 1 and not tdist.is_initialized():
        return Dist()
    if tdist.is_initialized():
        return Dist(
            rank=tdist.get_rank(),
            world=tdist.get_world_size(),
            local_rank=torchrun_local_rank() or 0,
            backend=str(tdist.get_backend()),
        )
    if not tdist.is_available():
        raise UserError("this torch build has no torch.distributed; run without torchrun")
    local_rank = torchrun_local_rank() or 0
    use_cuda = device_pref.startswith("cuda") or (
        device_pref == "auto" and torch.cuda.is_available()
    )
    backend = "nccl" if use_cuda else "gloo"
    if use_cuda:
        gpus, local_world = torch.cuda.device_count(), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        if max(local_world, local_rank + 1) > gpus:
            raise UserError(
                f"torchrun started {max(local_world, local_rank + 1)} processes on this node but "
                f"only {gpus} GPU(s) are visible (one GPU per process); use "
                f"--nproc_per_node={gpus}, or train.device=cpu to run the ranks on CPU (Gloo)"
            )
        torch.cuda.set_device(local_rank)
    tdist.init_process_group(backend=backend)
    return Dist(
        rank=tdist.get_rank(),
        world=tdist.get_world_size(),
        local_rank=local_rank,
        owns_group=True,
        backend=backend,
    )


def _shard_units(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks to shard one by one: the elements of the outermost ModuleLists."""
    units: list[nn.Module] = []
    covered: set[int] = set()
    for module in model.modules():
        if id(module) in covered or not isinstance(module, nn.ModuleList):
            continue
        for unit in module:
            units.append(unit)
            covered.update(id(m) for m in unit.modules())
    return units


def split(model: nn.Module, dist: Dist) -> list[str]:
    """Tensor parallelism: split ``model`` in place over the mesh's "tp" ranks
    (``attnlab.model.tensor_parallel.parallelize``); the report's lines (which parts split, which
    stay whole and why). Nothing to do (no lines) when ``dist.tp`` is 1."""
    if dist.tp <= 1:
        return []
    from attnlab.model.tensor_parallel import parallelize

    return parallelize(model, dist.mesh["tp"]).lines()


def wrap(model: nn.Module, parallel: str, dist: Dist, device: torch.device) -> nn.Module:
    """The module to run forward/backward through: ``model`` itself, DDP, or FSDP2 in place.

    FSDP2 (``fully_shard``) shards each block's parameters over ranks (all-gathered for its forward
    and backward, gradients reduce-scattered), so a model whose weights plus AdamW state do not fit
    on one device can still train; it changes ``model`` in place and returns it.
    """
    if not dist.enabled or dist.data_world == 1:  # one copy (all its ranks split it by --tp)
        return model
    if parallel == "fsdp" or dist.tp > 1:  # with --tp, the copies always shard by FSDP2
        from torch.distributed.fsdp import fully_shard

        mesh = dist.mesh["dp"] if dist.mesh is not None else None
        for unit in _shard_units(model):
            fully_shard(unit, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def tied_state(model: nn.Module, state: dict) -> dict:
    """``state`` with a tied parameter's names on one tensor (gathering a split model's state
    makes one copy per name; the checkpoint stores a tied tensor once, its aliases by name)."""
    first: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first and name in state and first[id(p)] in state:
            state[name] = state[first[id(p)]]
        first.setdefault(id(p), name)
    return state
