"""Parameter-matched controls (seed 001's MLP-widened baseline): pick an integer width so a
variant's non-embedding parameter count is as close as possible to a target's.

The count ``N(h)`` is non-decreasing in the width ``h`` (an MLP adds ``2 d h`` weights per layer,
SwiGLU ``3 d h``, plus biases), so a bisection finds the smallest ``h`` with ``N(h) >= target``
and the answer is that ``h`` or ``h - 1``, whichever is closer: ``O(log h)`` evaluations of
:func:`attnlab.model.params.count`, each a build on the meta device (no memory).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from attnlab.base.errors import UserError

MAX_WIDTH = 1 << 26


@dataclass
class MatchResult:
    """How a matched variant was sized."""

    target_variant: str
    knob: str
    value: int
    achieved: int
    target: int

    @property
    def gap(self) -> int:
        return self.achieved - self.target

    @property
    def rel_gap(self) -> float:
        """(achieved - target) / target."""
        return self.gap / self.target if self.target else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "gap": self.gap, "rel_gap": self.rel_gap}


def closest_integer(
    f: Callable[[int], int],
    target: int,
    lo: int = 1,
    hi: int | None = None,
    hint: int | None = None,
) -> tuple[int, int]:
    """``(x, f(x))`` with ``x >= lo`` minimising ``|f(x) - target|`` for non-decreasing ``f``.

    ``hi`` is found by doubling when not given; ``hint`` (e.g. the root of an affine fit) narrows
    the bracket to ``[hint - 1, hint + 1]`` when it holds the target. Ties go to the smaller ``x``.
    """
    f_lo = f(lo)
    if f_lo >= target:
        return lo, f_lo
    if hint is not None and hint - 1 > lo and f(hint - 1) < target <= f(hint + 1):
        lo, hi = hint - 1, hint + 1
    if hi is None:
        hi = max(2 * lo, 2)
        while f(hi) < target:
            if hi >= MAX_WIDTH:
                return hi, f(hi)
            hi *= 2
    elif f(hi) < target:
        return hi, f(hi)
    # invariant: f(lo) < target <= f(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
    f_lo, f_hi = f(lo), f(hi)
    return (lo, f_lo) if target - f_lo <= f_hi - target else (hi, f_hi)


def default_knob(model_cfg: Any) -> str:
    """The width resized by ``match_params`` when the variant does not say ``match_by``."""
    if model_cfg.mlp:
        return "model.ffn.hidden"
    for slot, cls in model_cfg.part_classes().items():
        if cls is not None and cls.width_option:
            return f"model.{slot}.{cls.width_option}"
    raise UserError(
        "match_params resizes the MLP (model.ffn.hidden), but this variant has model.mlp=false; "
        "give match_by = 'model.mixer.hidden' or another integer width key"
    )


def knob_value(cfg_dict: dict[str, Any], knob: str) -> Any:
    node: Any = cfg_dict
    for part in knob.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node
