"""µP applied to a built model: its weights rescaled from the standard init, the attention scale
``1/d_h`` and the readout multiplier ``1/m``, all relative to a base width.

At the base width every factor is 1: the model is exactly attnlab's standard model, so the
hyperparameters tuned there are the ones it transfers (Yang et al. 2022, "Tensor Programs V",
Table 8 with Adam). Relative to it, with ``m_d = d_model / d_model(base)``:

- weights: each parameter's init std times its ``init_scale`` (:class:`~.roles.ParamScaling`:
  m^-1/2 hidden, 1/m output, 1 otherwise). attnlab's init draws every random weight with a
  width-independent std (``model.init_std``, ``/ sqrt(2 depth)`` for output projections, a
  part's own ``init_std`` option), so multiplying the drawn weights is the µP init; zeros stay
  zero and a part that declares ``keep_init`` (an identity kernel) is left alone;
- attention: every core's softmax scale ``c / sqrt(d_h)`` becomes ``c sqrt(d_h(base)) / d_h``,
  i.e. ``1/d_h`` up to the base's constant (q and k become correlated in training, so their dot
  product grows like d_h, not sqrt(d_h)); with heads of a fixed size, as the ladder's size rule
  makes them, this factor is 1;
- readout: the hidden state the LM head reads is multiplied by ``1 / m_d`` (a forward hook on
  the last stack; the same as multiplying the logits, and it reaches the fused loss, which never
  forms them). The LM head's weight keeps its init and learning rate, which is what lets it be
  tied to the embedding (an input weight).

The learning rates are the optimizer's business: :mod:`.groups`. Cost: one pass over the
parameters and one build on the meta device (the base's shapes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from attnlab.config import ModelConfig
from attnlab.model.attention import AttentionCore
from attnlab.model.mup.roles import ParamScaling, scalings


@dataclass
class MupPlan:
    """What µP changes in one model relative to its base width."""

    base_d_model: int
    d_model: int
    params: dict[str, ParamScaling]
    #: factor on every attention core's softmax scale: sqrt(d_h(base) / d_h)
    attention_scale: float
    #: factor on the hidden state the LM head reads: d_model(base) / d_model
    output_multiplier: float
    hooks: list = field(default_factory=list, repr=False)

    @property
    def width_mult(self) -> float:
        return self.d_model / self.base_d_model

    def rows(self) -> list[tuple[str, str, float, float, float, str]]:
        """(name, role, m, init factor, lr factor, declared/inferred) per parameter."""
        return [
            (s.name, s.role, s.width_mult, s.init_scale, s.lr_scale,
             "declared" if s.declared else "inferred")
            for s in self.params.values()
        ]  # fmt: skip


def plan(model: nn.Module, cfg: ModelConfig, base: ModelConfig) -> MupPlan:
    """The µP plan of ``model`` (built from ``cfg``) relative to ``base`` (the same architecture
    at the base width; any depth)."""
    return MupPlan(
        base_d_model=base.d_model,
        d_model=cfg.d_model,
        params=scalings(model, base),
        attention_scale=math.sqrt(base.head_dim / cfg.head_dim),
        output_multiplier=base.d_model / cfg.d_model,
    )


def base_config(cfg: ModelConfig) -> ModelConfig:
    """The standard model at ``cfg``'s µP base width (``mup_base_width``, else ``d_model``):
    heads of the same size when ``attention.head_dim`` is set (their number scaled), else the
    same number of heads; an absolute FFN width (a matched control's ``ffn.hidden``) scaled with
    the width, so it is an infinite dimension as ``ratio x d_model`` is."""
    w = cfg.mup_base_width or cfg.d_model
    a = cfg.attention
    att: dict = {}
    if a.head_dim is not None:
        heads = max(1, w // a.head_dim)
        att["n_heads"] = heads
        if a.n_kv_heads is not None:
            att["n_kv_heads"] = max(1, a.n_kv_heads * heads // a.n_heads)
    update: dict = {
        "d_model": w,
        "parametrisation": "standard",
        "mup_base_width": None,
        "attention": a.model_copy(update=att),
    }
    hidden = getattr(cfg.ffn, "hidden", None)
    if hidden:
        update["ffn"] = cfg.ffn.model_copy(
            update={"hidden": max(1, round(hidden * w / cfg.d_model))}
        )
    return cfg.model_copy(update=update)


def apply_configured(model: nn.Module, cfg: ModelConfig) -> MupPlan | None:
    """µP on a freshly built model when ``cfg.parametrisation`` is ``"mup"`` (what
    :func:`attnlab.model.build_model` calls; a loaded checkpoint then replaces the rescaled
    init, and the attention scale and readout multiplier follow from the config alone)."""
    if cfg.parametrisation != "mup":
        return None
    return apply_mup(model, cfg, base_config(cfg))


def _readout_stack(model: nn.Module) -> nn.Module:
    stack = getattr(model, "decoder", None) or getattr(model, "encoder", None)
    if stack is None:
        raise ValueError("µP needs a model with a decoder or an encoder stack before its LM head")
    return stack


@torch.no_grad()
def apply_mup(model: nn.Module, cfg: ModelConfig, base: ModelConfig) -> MupPlan:
    """Make a freshly initialised attnlab model µP relative to ``base``: rescale its weights,
    set its attention scale and install the readout multiplier. Applying it twice is refused
    (the factors would compound)."""
    if getattr(model, "mup_plan", None) is not None:
        raise ValueError("µP is already applied to this model; build a fresh one")
    p = plan(model, cfg, base)
    for name, param in model.named_parameters():
        factor = p.params[name].init_scale
        if factor != 1.0:
            param.mul_(factor)
    for m in model.modules():
        if isinstance(m, AttentionCore):
            m.scale *= p.attention_scale
    mult = p.output_multiplier
    if mult != 1.0:

        def scale_output(module: nn.Module, args: tuple, out: tuple) -> tuple:
            return (out[0] * mult, *out[1:])

        p.hooks.append(_readout_stack(model).register_forward_hook(scale_output))
    model.mup_plan = p
    return p
