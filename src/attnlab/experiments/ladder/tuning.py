"""The learning rate of each variant at a rung: its tuning sweep (``ladder.lr``, one seed, the
rung's budget) trained through ``run_all`` like any sweep, then the best final validation loss
per variant.

    lr*(variant, rung) = argmin over the grid of final_val_loss(variant @ lr, tune_seed)

A diverged or failed grid point is never chosen; a variant with no finished point is refused
with the fix (a lower grid). A best value at the edge of the grid is reported (the optimum may
lie beyond it). Cost: ``len(ladder.lr) x variants`` runs of the rung.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from attnlab.base.errors import UserError
from attnlab.experiments.resolve import Experiment
from attnlab.experiments.running.execute import RunOutcome


@dataclass
class TunedRung:
    """The chosen learning rate per variant, every grid point's loss, and the edge warnings."""

    index: int
    lrs: dict[str, float]
    losses: dict[str, dict[float, float | None]] = field(default_factory=dict)
    at_edge: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "index": self.index,
            "lr": self.lrs,
            "losses": {v: {repr(k): x for k, x in d.items()} for v, d in self.losses.items()},
            "at_edge": self.at_edge,
        }


def choose(exp: Experiment, outcomes: list[RunOutcome], index: int, where: Path) -> TunedRung:
    """Each variant's best learning rate among ``outcomes`` of the tuning sweep ``exp``."""
    by_arm = {o.variant: o for o in outcomes}
    losses: dict[str, dict[float, float | None]] = {}
    for arm, v in exp.variants.items():
        lr = float(v.point["train.lr"])
        o = by_arm.get(arm)
        ok = o is not None and o.status == "finished" and _finite(o.final_val_loss)
        losses.setdefault(v.base, {})[lr] = float(o.final_val_loss) if ok else None
    lrs, edge = {}, []
    for name, row in losses.items():
        done = {lr: x for lr, x in row.items() if x is not None}
        if not done:
            raise UserError(
                f"rung {index}: variant {name!r} finished no run of its learning-rate grid "
                f"{sorted(row)} (diverged or failed; see {where}); lower ladder.lr or its "
                "largest values"
            )
        best = min(done, key=lambda lr: done[lr])
        lrs[name] = best
        if len(row) > 1 and best in (min(row), max(row)):
            edge.append(name)
    return TunedRung(index, lrs, losses, edge)


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(float(x))
