"""Quantize an attnlab model in place with torchao: ``quantize_model(model, scheme)``.

The weights the plan (:mod:`attnlab.quant.plan`) names go through ``torchao.quantize_`` with the
scheme's config and become torchao tensor subclasses (``Int8Tensor``, ``Int4OpaqueTensor``);
everything else is untouched. The model must be built with ``model.attention.fuse_qkv=false``
(:func:`quantizable_config`): the fused Q, K, V matmul concatenates the three weights at run
time, which a quantized weight does not support, and with it off each projection is one
quantized Linear (the same weights, the same outputs in float).

Cost: one pass over the planned weights (a max and a rounding per row or group).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from attnlab.base.errors import UserError
from attnlab.quant.plan import Plan, plan
from attnlab.quant.schemes import Scheme

#: what a model built for quantization sets (see the module docstring)
QUANT_OVERRIDES = ("model.attention.fuse_qkv=false",)


def quantizable_config(cfg: Any) -> Any:
    """``cfg`` with the settings a quantized model needs (``QUANT_OVERRIDES``)."""
    from attnlab.config import apply_overrides, validate

    return validate(apply_overrides(cfg.to_dict(), QUANT_OVERRIDES))


def is_quantized(t: Tensor) -> bool:
    """Whether ``t`` is a quantized weight (a tensor subclass), not a plain float tensor."""
    return type(t.data) is not Tensor


def untie(model: nn.Module, names: set[str]) -> None:
    """Give each module of ``names`` whose weight is shared with another module (an LM head
    tied to the token embedding) its own copy, so quantizing it leaves the other one float.
    Cost: one copy of each such weight (d x vocab for the head)."""
    shared: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        shared[id(p)] = shared.get(id(p), 0) + 1
    for name in names:
        lin = model.get_submodule(name)
        if shared.get(id(lin.weight), 0) > 1:
            lin.weight = nn.Parameter(lin.weight.detach().clone(), requires_grad=False)


def quantize_model(
    model: nn.Module,
    scheme: Scheme,
    group_size: int | None = None,
    only: set[str] | None = None,
    *,
    tied_head: bool = False,
) -> Plan:
    """Quantize ``model``'s planned weights in place with ``scheme``; returns the plan, with the
    weights torchao could not take (an int4 group size that does not divide a Linear's inputs)
    moved to the kept list with that reason. ``only``: quantize just these planned modules.
    ``tied_head``: quantize an LM head tied to the token embedding as its own copy
    (:func:`attnlab.quant.plan.plan`); the embedding stays float for its lookups."""
    from attnlab.quant.schemes import quiet_torchao

    with quiet_torchao():
        from torchao.quantization import quantize_

    fused = [n for n, m in model.named_modules() if getattr(m, "fused", False)]
    if fused:
        raise UserError(
            f"{fused[0]} multiplies Q, K and V as one fused matmul; build the model with "
            f"{QUANT_OVERRIDES[0]} to quantize it (attnlab quantize does)"
        )
    result = plan(model, tied_head=tied_head)
    targets = set(result.quantized) if only is None else set(result.quantized) & only
    for name in sorted(targets):
        lin = model.get_submodule(name)
        why = scheme.shape_problem(lin.in_features, lin.out_features, group_size)
        if why is not None:
            targets.discard(name)
            result.quantized.remove(name)
            result.kept[f"{name}.weight"] = f"{scheme.name} cannot take this Linear: {why}"
    config = scheme.config(group_size)
    untie(model, targets)
    quantize_(model, config, filter_fn=lambda m, fqn: fqn in targets)
    for name in list(result.quantized):
        weight = model.get_submodule(name).weight
        if name in targets and not is_quantized(weight):
            result.quantized.remove(name)
            result.kept[f"{name}.weight"] = (
                f"{scheme.name} cannot take its shape {tuple(weight.shape)} (group size "
                f"{group_size} must divide its {weight.shape[1]} inputs)"
            )
        elif name not in targets:
            result.quantized.remove(name)
    return result
