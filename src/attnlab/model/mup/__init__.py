"""µP, the maximal-update parametrisation (Yang et al. 2022, "Tensor Programs V"), by attnlab's
own per-part rule: hyperparameters tuned at a base width hold at every width.

    roles    each parameter's role (input, hidden, output, fixed) and width multiplier, from its
             part's ``width_scaling`` declaration or its shape against the base width
    apply    :func:`apply_mup`: init rescaled, attention scale 1/d_h, readout multiplier 1/m
    groups   :func:`mup_param_groups`: Adam groups with ``lr_scale`` (1/m hidden and output);
             :func:`set_lr` sets ``lr x lr_scale`` per group

Why not the ``mup`` package: its one release (1.0.0, March 2022) pins no torch version but needs
torchvision, pandas and seaborn; it keeps base shapes as ``p.infshape`` attributes that a state
dict, DDP/FSDP wrapping or ``torch.compile`` do not carry; and it requires every output layer to
be its ``MuReadout`` (asserting otherwise), which would thread its classes through attnlab's LM
head, its fused loss (which reads the head's weight, not its forward) and every part with a
finite output (a router). attnlab's parts already declare what the rest of the code reads; one
more declaration, defaulting to the shape rule, covers µP without touching the block.

Proposed wiring (not built yet):

- config: ``[model.mup] base_width = 64`` (None = standard parametrisation); the base is the
  same config with ``d_model`` (and the heads, at fixed ``head_dim``) at ``base_width``. The
  trainer builds the model, then ``apply_mup(model, cfg.model, base)``; a checkpoint stores the
  plan's factors so ``resume``, ``eval`` and export rebuild the same model (the readout
  multiplier becomes a ``Transformer`` attribute read by ``forward``, replacing the hook).
- optimizer: ``runs.optim.build_optimizer`` takes ``mup_param_groups`` when the model has a
  plan, and ``runs.optim.set_lr`` multiplies by ``lr_scale`` (a key torch keeps in the groups
  and the checkpoint's JSON stores).
- battery: a ``coordinate_check`` property in ``attnlab.testing`` running
  :func:`attnlab.testing.coord_check.coordinate_check` over each part's small-model cases at
  widths 32..256 (two layers, a few seconds), failing with the first weight that grows; plugins
  get it through ``check_part``.
- ladder: with µP the learning rate tuned at rung 0 is used at every rung; without it, a small
  grid per rung (the sweep machinery), and the report says which.

What µP does not cover: depth. The ladder grows both; the residual branches' ``1/sqrt(2 depth)``
init stays, and transfer across depth is an empirical question the ladder's curves answer.
"""

from attnlab.model.mup.apply import MupPlan, apply_mup, plan
from attnlab.model.mup.groups import mup_param_groups, set_lr
from attnlab.model.mup.roles import ParamScaling, infer, scalings

__all__ = [
    "MupPlan",
    "ParamScaling",
    "apply_mup",
    "infer",
    "mup_param_groups",
    "plan",
    "scalings",
    "set_lr",
]
