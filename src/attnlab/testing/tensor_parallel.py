"""Tensor parallelism: a part's model split over 2 gloo processes computes what it computes whole.

For each job (a part in one small-model case, float32 on CPU), every rank builds the model
twice from one seed, splits the second over the ``tp`` mesh (``attnlab.model.tensor_parallel``)
and measures, against the whole model in the same process:

- ``logits``: max |logits_TP - logits_1| of one forward (limit ``LIMIT`` = 1e-5);
- ``loss`` and ``grad``: one training step's loss difference and the largest difference of a
  gathered gradient, relative to the largest gradient entry (limit ``GRAD_LIMIT``);
- ``decode``: cached token-by-token decoding of the split model against its own full forward
  (the cache holds the rank's KV heads), in a family that decodes with a cache;
- ``share``: the parameters a rank holds / the whole model's (1/P where everything splits).

The processes start once for a list of jobs (``run``): starting two Python processes that import
torch costs seconds, a job a fraction of one. Gloo runs every collective this needs (all-reduce,
all-gather: DTensor redistributions between Replicate, Shard and Partial).
"""

from __future__ import annotations

import inspect
import json
import os
import socket
import tempfile
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from attnlab.testing.cases import Case
from attnlab.testing.result import Result, failed, passed

NAME = "tp"
#: |logits_TP - logits_1| in float32 (the issue's bound)
LIMIT = 1e-5
#: a gathered gradient's largest difference, relative to the largest gradient entry
GRAD_LIMIT = 1e-4
#: processes of the check's mesh
SIZE = 2


@dataclass(frozen=True)
class Job:
    """One part (``slot.kind`` with ``options``) in one case; ``plugin``: the file its class
    comes from (loaded in each process), None for a built-in part."""

    slot: str
    kind: str
    case: Case
    options: dict[str, Any] = field(default_factory=dict)
    plugin: str | None = None
    sets: tuple[str, ...] = ()


def job_for(slot: str, kind: str, case: Case, options: dict | None = None, sets=()) -> Job:
    """A job for a registered part (its plugin file found from its class)."""
    from attnlab.parts import registry

    spec = registry.get(slot, kind)
    plugin = None if spec.source == registry.BUILTIN else inspect.getsourcefile(spec.cls)
    return Job(slot, kind, case, dict(options or {}), plugin, tuple(sets))


def _local_share(model: torch.nn.Module) -> tuple[int, int]:
    """(elements this rank holds, elements of the whole model), each tensor once."""
    from torch.distributed.tensor import DTensor

    held = whole = 0
    for p in {id(p): p for p in model.parameters()}.values():
        whole += p.numel()
        held += p.to_local().numel() if isinstance(p, DTensor) else p.numel()
    return held, whole


def _full(t: torch.Tensor) -> torch.Tensor:
    full = getattr(t, "full_tensor", None)
    return full() if callable(full) else t


def _step(model, case: Case, x: torch.Tensor) -> torch.Tensor:
    from attnlab.testing.cases import inputs

    model.train()
    out = model(x[:, :-1], x[:, 1:], **inputs(case, x[:, :-1], cfg=model.cfg))
    loss = out.loss if out.aux_loss is None else out.loss + out.aux_loss
    loss.backward()
    model.eval()
    return loss.detach()


def measure(job: Job, mesh) -> dict[str, Any]:
    """The job's differences on this rank (every rank computes the same numbers)."""
    from attnlab.model.tensor_parallel import parallelize
    from attnlab.parts import families
    from attnlab.testing.cases import build, config_for, forward, ids
    from attnlab.testing.kv_cache import measure as decode_difference

    cfg = config_for(job.case, job.slot, job.kind, job.options, job.sets)
    whole = build(cfg, dtype=torch.float32)
    split = build(cfg, dtype=torch.float32)
    report = parallelize(split, mesh)
    x = ids(2, seed=7)
    with torch.no_grad():
        logits = float((forward(split, job.case, x) - forward(whole, job.case, x)).abs().max())
    loss_1, loss_tp = _step(whole, job.case, x), _step(split, job.case, x)
    grads = dict(split.named_parameters())
    scale, worst = 0.0, 0.0
    for name, p in whole.named_parameters():
        if p.grad is None:
            continue
        scale = max(scale, float(p.grad.abs().max()))
        worst = max(worst, float((_full(grads[name].grad) - p.grad).abs().max()))
    decode = None
    decodes = job.case.causal and families.get(job.case.family).decodes_with_cache
    if decodes and split.supports_cache:
        d = decode_difference(split, job.case, job.kind)
        decode = d if isinstance(d, float) else float("inf")
    held, total = _local_share(split)
    return {
        "logits": logits,
        "loss": abs(float(loss_tp - loss_1)),
        "grad": worst / max(scale, 1e-30),
        "decode": decode,
        "share": held / total,
        "report": report.lines(),
    }


def _worker(rank: int, size: int, port: int, jobs: list[Job], out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from attnlab.parts.plugins import load_plugin

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size
    )
    try:
        mesh = init_device_mesh("cpu", (size,), mesh_dim_names=("tp",))
        results = []
        for job in jobs:
            try:
                if job.plugin:
                    load_plugin(job.plugin)
                results.append(measure(job, mesh))
            except Exception as e:  # one job's failure is its result, the others still run
                results.append(
                    {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
                )
        if rank == 0:
            Path(out).write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(jobs: list[Job], size: int = SIZE) -> list[dict[str, Any]]:
    """Each job's measurements (or ``{"error": ...}``) from ``size`` gloo processes."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="attnlab-tp-") as tmp:
        out = os.path.join(tmp, "results.json")
        mp.start_processes(
            _worker, args=(size, _free_port(), jobs, out), nprocs=size, start_method="spawn"
        )
        return json.loads(Path(out).read_text())


def result(name: str, job: Job, got: dict[str, Any]) -> Result:
    """The battery's ``tp`` property from one job's measurements."""
    where = job.case.name
    if "error" in got:
        return failed(
            NAME,
            f"{name} split over {SIZE} ranks raised {got['error']}",
            "declare tp_plan() as attnlab.parts.tp describes, or TPPlan.whole(why)",
            where=where,
        )
    for key, limit in (("logits", LIMIT), ("loss", LIMIT), ("grad", GRAD_LIMIT)):
        if not got[key] <= limit:
            return failed(
                NAME,
                f"{name} split over {SIZE} ranks: {key} differ from one "
                f"process by {got[key]:.3g} (limit {limit:g})",
                "a split part must return its rank's share (see attnlab.parts.tp); "
                "declare TPPlan.whole(why) where it cannot",
                got[key],
                limit,
                where,
            )
    decode = got["decode"]
    if decode is not None and not decode <= LIMIT:
        return failed(
            NAME,
            f"cached decoding of {name} split over {SIZE} ranks differs from "
            f"its full forward by {decode:.3g}",
            "the cache holds the rank's KV heads: a key/value part must return its rank's heads",
            decode,
            LIMIT,
            where,
        )
    return passed(
        NAME,
        f"split over {SIZE} gloo ranks: logits {got['logits']:.2g}, grad "
        f"{got['grad']:.2g} (relative), holds {got['share']:.0%} of the weights",
        got["logits"],
        LIMIT,
    )


def summary(job: Job, got: dict[str, Any]) -> dict[str, Any]:
    """A JSON-able line for logs and docs."""
    return {
        "part": f"{job.slot}.{job.kind}",
        "case": job.case.name,
        **asdict(job)["options"],
        **{k: v for k, v in got.items() if k != "traceback"},
    }
