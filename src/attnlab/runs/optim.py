"""AdamW with decay on >= 2-D weights only, and the warmup + cosine learning-rate schedule.

Schedule (step ``s`` counted from 0, ``W`` warmup steps, ``S`` total steps)::

    lr(s) = lr_max * (s + 1) / W                                          for s < W
    lr(s) = lr_min + (lr_max - lr_min) * (1 + cos(pi * (s - W) / (S - W))) / 2   otherwise

Weight decay applies to matrices and embeddings (``p.ndim >= 2``) and never to biases, norm gains or
other vectors, as in GPT-2/nanoGPT: decaying a gain pulls it toward 0, not toward its neutral value 1.
Only trainable tensors (``requires_grad``) are optimised, so the same grouping serves pretraining
(every weight) and the frozen probe (the injected and LoRA tensors of a frozen base).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from attnlab.model.mup.groups import set_lr  # lr x each group's lr_scale (µP); re-exported
from attnlab.recipe import TrainRecipe

__all__ = ["build_optimizer", "lr_at", "param_groups", "recipe_optimizer", "set_lr"]


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two AdamW groups: ``weight_decay`` on >= 2-D trainable tensors, 0 on the rest.

    Uses ``model.param_groups(weight_decay)`` when the model defines it (it may know better, e.g.
    about tied weights); otherwise applies the ``ndim >= 2`` rule, honouring a parameter marked
    ``no_weight_decay``. Frozen tensors are left out; tied parameters appear once.
    """
    own = getattr(model, "param_groups", None)
    if callable(own):
        return list(own(weight_decay))
    decay, no_decay, seen = [], [], set()
    for p in model.parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        wd = p.ndim >= 2 and not getattr(p, "no_weight_decay", False)
        (decay if wd else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def build_optimizer(
    model: nn.Module,
    *,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
    device: torch.device,
) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups`; the fused kernel on CUDA, the foreach one elsewhere,
    and the per-tensor one when the parameters mix DTensors of a mesh with plain tensors
    (tensor parallelism: a replicated part's weights stay plain; one multi-tensor kernel call
    cannot take both).

    Cost: 2 extra fp32 tensors per parameter (first and second moments), i.e. 8 bytes/param.
    """
    from torch.distributed.tensor import DTensor

    groups = param_groups(model, weight_decay)
    kwargs: dict[str, Any] = {"lr": lr, "betas": betas}
    kinds = {isinstance(p, DTensor) for g in groups for p in g["params"]}
    specs = {
        (id(p.device_mesh), p.placements)
        for g in groups
        for p in g["params"]
        if isinstance(p, DTensor)
    }
    if len(kinds) > 1 or len(specs) > 1:
        kwargs["foreach"] = False
    elif device.type == "cuda":
        kwargs["fused"] = True
    else:
        kwargs["foreach"] = True
    return torch.optim.AdamW(groups, **kwargs)


def keep_kernels(optimizer: torch.optim.Optimizer) -> None:
    """Restore the kernel choice (``foreach``, ``fused``) this process built ``optimizer`` with
    after loading a state dict, which carries the writer's: a checkpoint written whole (foreach)
    resumes split by ``--tp`` (per-tensor) and the other way round."""
    for group in optimizer.param_groups:
        for key in ("foreach", "fused"):
            if key in optimizer.defaults:
                group[key] = optimizer.defaults[key]


def recipe_optimizer(
    model: nn.Module, recipe: TrainRecipe, device: torch.device
) -> torch.optim.AdamW:
    """:func:`build_optimizer` with a ``[train]`` recipe's lr, weight decay and betas (every
    protocol builds its optimizer through this)."""
    return build_optimizer(
        model, lr=recipe.lr, weight_decay=recipe.weight_decay, betas=recipe.betas, device=device
    )


def lr_at(step: int, *, lr: float, min_lr: float, warmup_steps: int, max_steps: int) -> float:
    """The learning rate for optimizer step ``step`` (0-based): linear warmup, then cosine."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if max_steps <= warmup_steps:
        return lr
    progress = min(1.0, (step - warmup_steps) / (max_steps - warmup_steps))
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
