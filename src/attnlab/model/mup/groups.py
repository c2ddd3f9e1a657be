"""Adam parameter groups under µP: the model's own decay grouping, split by learning-rate factor.

Each group carries ``lr_scale`` (1/m for hidden and output weights, 1 otherwise: Adam's update
of a matrix moves its output by about ``lr x fan-in``, so ``lr / m`` keeps that move the same at
every width) and a weight decay multiplied by ``1 / lr_scale``, so AdamW's decoupled decay
``lr x wd`` per step is the same at every width (as ``mup``'s MuAdamW does). The learning rate a
schedule sets is then ``lr x lr_scale`` per group (:func:`set_lr`). Cost: a pass over the
parameters.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from attnlab.model.mup.apply import MupPlan


def mup_param_groups(model: nn.Module, plan: MupPlan, weight_decay: float) -> list[dict[str, Any]]:
    """The model's ``param_groups(weight_decay)`` split by each parameter's ``lr_scale`` (a
    model whose own ``param_groups`` already splits them, as a µP-configured attnlab model's
    does, is returned as it groups itself)."""
    groups = model.param_groups(weight_decay)
    if all("lr_scale" in g for g in groups):
        return groups
    return split_groups(model, plan, groups)


def split_groups(
    model: nn.Module, plan: MupPlan, groups: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """``groups`` (decay grouping) split by each parameter's ``lr_scale``, the decay of each
    divided by it."""
    names = {id(p): n for n, p in model.named_parameters()}
    out: list[dict[str, Any]] = []
    for group in groups:
        by_scale: dict[float, list[nn.Parameter]] = {}
        for p in group["params"]:
            by_scale.setdefault(plan.params[names[id(p)]].lr_scale, []).append(p)
        for scale, params in sorted(by_scale.items(), reverse=True):
            out.append(
                {"params": params, "weight_decay": group["weight_decay"] / scale, "lr_scale": scale}
            )
    return out


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Each group's learning rate: ``lr x lr_scale`` (1 where a group has none)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
