"""How a part's parameters scale with the model's width: the declaration µP reads (Yang et al.
2022, "Tensor Programs V"; :mod:`attnlab.model.mup` applies it).

Every dimension of a parameter is either *finite* (it stays put as the model widens: the
vocabulary, a kernel size, the number of experts) or *infinite* (it grows with ``d_model``: the
width, the heads when their size is fixed, an FFN's ``ratio x d``). The role follows from which of
the fan-in and fan-out are infinite:

=========  ============  ===========  ========================  ==========================
role       fan-in        fan-out      init std (vs. the base)   Adam learning rate
=========  ============  ===========  ========================  ==========================
input      finite        infinite     unchanged                 unchanged
hidden     infinite      infinite     x m^-1/2 (var 1/fan-in)   x 1/m
output     infinite      finite       x 1/m    (var 1/fan-in^2) x 1/m
fixed      finite        finite       unchanged                 unchanged
=========  ============  ===========  ========================  ==========================

with ``m = fan_in / fan_in(base)`` the parameter's own width multiplier. Vectors (biases, norm
gains) are input-like; the LM head is the model's readout, handled by the model (its logits
are multiplied by ``1 / m``: TP5's Table 8 form, which works when it shares its weight with the
embedding).

A part declares a parameter only when its shape does not say it: a raw ``nn.Parameter`` whose
fan-in is not dimension 1 (stacked experts ``[E, d, h]``), a bias stored as a matrix, or an init
that is already width-independent (an identity kernel, which must not be rescaled). Parameters
it does not declare are inferred from their shapes against the model at the base width.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

WidthRole = Literal["input", "hidden", "output", "fixed"]
ROLES: tuple[WidthRole, ...] = ("input", "hidden", "output", "fixed")


@dataclass(frozen=True)
class WidthScaling:
    """One parameter's declaration: its ``role``, which dimension is its fan-in (``fan_in_dim``,
    1 for a Linear's ``[out, in]`` weight), and ``keep_init`` when its own init is already right at
    every width (an identity or zero init), so µP scales only its learning rate."""

    role: WidthRole
    fan_in_dim: int = 1
    keep_init: bool = False

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"width role {self.role!r}; choose one of {', '.join(ROLES)}")
