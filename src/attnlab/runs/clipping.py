"""The pre-clip gradient norm and clipping, also when the parameters are split over a mesh.

||g|| = sqrt(sum_i ||g_i||^2) over every trainable gradient, each counted once whole; if
``max_norm`` is finite and ||g|| > max_norm every g_i is scaled by max_norm / (||g|| + 1e-6)
(``torch.nn.utils.clip_grad_norm_``'s rule). Under tensor parallelism (alone or with FSDP2 on a
("dp", "tp") mesh) the parameters are a mix of plain tensors (a replicated part's, the same on
every rank) and DTensors on different meshes, which torch's one ``_foreach_norm`` over all of
them refuses; here each group of one kind (plain, or one mesh and placement) takes its norm with
``torch.nn.utils.get_total_norm`` and a DTensor group's norm is made whole (one all-reduce per
group). Cost: one pass over the gradients, plus those all-reduces.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch.distributed.tensor import DTensor


def _groups(grads: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    groups: dict[object, list[torch.Tensor]] = {}
    for g in grads:
        key = (id(g.device_mesh), tuple(g.placements)) if isinstance(g, DTensor) else None
        groups.setdefault(key, []).append(g)
    return list(groups.values())


@torch.no_grad()
def clip_grad_norm(params: Iterable[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """Clip the gradients of ``params`` in place to a total norm of ``max_norm`` (``inf``: only
    measure) and return their total norm before clipping (a plain scalar tensor)."""
    params = list(params)
    grads = [p.grad for p in params if p.grad is not None]
    if not any(isinstance(g, DTensor) for g in grads):
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    if not grads:
        return torch.zeros(())
    norms = []
    for group in _groups(grads):
        n = torch.nn.utils.get_total_norm(group)
        norms.append(n.full_tensor() if isinstance(n, DTensor) else n)
    total = torch.linalg.vector_norm(torch.stack([n.float().cpu() for n in norms]))
    if math.isfinite(max_norm):
        coef = float(torch.clamp(max_norm / (total + 1e-6), max=1.0))
        if coef < 1.0:
            for g in grads:
                g.mul_(coef)
    return total
