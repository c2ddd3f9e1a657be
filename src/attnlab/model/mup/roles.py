"""Each parameter's µP role and width multiplier, from its part's declaration or from its shape
against the same architecture at the base width.

A dimension is infinite when it differs between the model and the base model (built on the meta
device: no memory); the role follows from its fan-in and fan-out (:mod:`attnlab.parts.width`).
Fan-in is dimension 1 (``nn.Linear``'s ``[out, in]``), dimension 0 for an ``nn.Embedding``'s
``[vocab, d]``, and what a part declares otherwise. The base may have another depth (a ladder
grows width and depth together): parameters are matched by name with layer indices ignored
(``decoder.blocks.7.ffn.w_in.weight`` is matched with ``decoder.blocks.*.ffn.w_in.weight``).
Cost: one build on the meta device and a pass over the parameters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import nn

from attnlab.base.errors import UserError
from attnlab.config import ModelConfig
from attnlab.parts import Part, WidthScaling

_INDEX = re.compile(r"\.\d+(?=\.)")


@dataclass(frozen=True)
class ParamScaling:
    """One parameter's µP rule: its role (a part's role, or ``readout`` for an untied LM head,
    whose scale is the readout multiplier's), its width multiplier ``m`` (fan-in over the base's
    fan-in; 1 where the fan-in is finite), whether its init is kept, and where the role came
    from (``declared`` by its part, or inferred from its shape)."""

    name: str
    role: str
    width_mult: float
    keep_init: bool = False
    declared: bool = False

    @property
    def init_scale(self) -> float:
        """The factor on the init std: m^-1/2 (hidden), 1/m (output), else 1."""
        if self.keep_init:
            return 1.0
        return {"hidden": self.width_mult**-0.5, "output": 1.0 / self.width_mult}.get(
            self.role, 1.0
        )

    @property
    def lr_scale(self) -> float:
        """The factor on Adam's learning rate: 1/m for hidden and output weights, else 1."""
        return 1.0 / self.width_mult if self.role in ("hidden", "output") else 1.0


def layerless(name: str) -> str:
    """``name`` with its layer indices as ``*`` (the key a base model of another depth shares)."""
    return _INDEX.sub(".*", name)


def base_shapes(base: ModelConfig, build: type[nn.Module]) -> dict[str, torch.Size]:
    """Layerless parameter name -> shape in the model ``base`` describes, built on meta by
    ``build`` (the model's own class: the standard model of ``base``)."""
    with torch.device("meta"):
        model = build(base)
    out: dict[str, torch.Size] = {}
    for name, p in model.named_parameters():
        out.setdefault(layerless(name), p.shape)
    return out


def infer(shape: torch.Size, base: torch.Size, fan_in_dim: int = 1) -> tuple[str, float]:
    """(role, width multiplier) of a parameter from its shape and its shape at the base width."""
    inf = [a != b for a, b in zip(shape, base)]
    if len(shape) == 0:
        return "fixed", 1.0
    if len(shape) == 1:
        return ("input" if inf[0] else "fixed"), 1.0
    fan_out_dim = 1 if fan_in_dim == 0 else 0
    fin, fout = inf[fan_in_dim], inf[fan_out_dim]
    m = shape[fan_in_dim] / base[fan_in_dim] if fin else 1.0
    role = "hidden" if fin and fout else "output" if fin else "input" if fout else "fixed"
    return role, m


def declarations(model: nn.Module) -> dict[str, WidthScaling]:
    """Full parameter name -> the declaration of the part that holds it (outermost part wins)."""
    out: dict[str, WidthScaling] = {}
    for prefix, module in model.named_modules():
        if not isinstance(module, Part):
            continue
        own = dict(module.named_parameters())
        for rel, decl in module.width_scaling().items():
            if rel not in own:
                if "." not in rel and getattr(module, rel, False) is None:
                    continue  # an optional parameter this configuration leaves out (a bias)
                raise UserError(
                    f"{type(module).__name__} ({module.slot}:{module.kind}) declares "
                    f"width_scaling for {rel!r}, which is not one of its parameters "
                    f"({', '.join(own) or 'none'}); name them as named_parameters() does"
                )
            out.setdefault(f"{prefix}.{rel}" if prefix else rel, decl)
    return out


def scalings(model: nn.Module, base: ModelConfig) -> dict[str, ParamScaling]:
    """Every (deduplicated) parameter of ``model`` -> its :class:`ParamScaling` against ``base``."""
    shapes = base_shapes(base, type(model))
    declared = declarations(model)
    head = getattr(model, "lm_head", None)
    readout = {id(head.weight)} if isinstance(head, nn.Linear) else set()
    embeds = {
        f"{n}.weight" if n else "weight"
        for n, m in model.named_modules()
        if isinstance(m, nn.Embedding)
    }
    out: dict[str, ParamScaling] = {}
    for name, p in model.named_parameters():
        key = layerless(name)
        if key not in shapes or len(shapes[key]) != p.dim():
            raise UserError(
                f"parameter {name} {tuple(p.shape)} has no counterpart in the base model; µP's "
                "base must be the same architecture at another width (same parts and options)"
            )
        if id(p) in readout and name != "embed.weight":  # untied: the readout (see apply.py)
            out[name] = ParamScaling(name, "readout", 1.0)
            continue
        decl = declared.get(name)
        fan_in = decl.fan_in_dim if decl else (0 if name in embeds else 1)
        role, m = infer(p.shape, shapes[key], fan_in)
        if decl is not None:
            role = decl.role
            m = m if role in ("hidden", "output") else 1.0
        out[name] = ParamScaling(name, role, m, bool(decl and decl.keep_init), decl is not None)
    return out
