"""The numbers of a sweep report, from its runs' rows (no training, no files).

- a *cell* is one (variant, grid point): its runs over seeds, the mean ± std of the final
  validation loss of the seeds that finished, and how many diverged, were pruned or failed;
- the *best point* of a variant is its cell with the lowest mean final loss among the cells where
  every seed finished (a point where some seed diverged cannot be best);
- *best vs best*: each variant's best cell against the baseline's best cell, paired by seed
  (seed ``k`` of both read the same batches), with :func:`~attnlab.experiments.reports.stats.paired_test`;
- the *stable learning-rate range* of a variant, per value of the other grid keys (a "facet",
  e.g. one weight decay): the learning rates whose cell has no diverged, pruned or failed seed and
  a mean final loss ``<= (1 + X/100) x`` the variant's best mean final loss over the whole grid.
  Its width is ``max lr / min lr`` of that set (1 for a single rate, 0 for none).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from attnlab.experiments.reports.stats import (
    PairedTest,
    mean_std,
    paired_test,
    relative_improvement,
)
from attnlab.experiments.results import RunRow

LR_KEY = "train.lr"
BAD = ("diverged", "pruned", "failed")


@dataclass
class Cell:
    """One (variant, grid point) over seeds."""

    variant: str
    point: dict[str, Any]
    rows: list[RunRow]
    mean: float = math.nan
    std: float = math.nan
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.rows)

    @property
    def n_ok(self) -> int:
        return sum(r.ok for r in self.rows)

    @property
    def complete(self) -> bool:
        """Every seed finished with a finite loss."""
        return self.n > 0 and self.n_ok == self.n

    @property
    def n_bad(self) -> int:
        return sum(self.counts.get(k, 0) for k in BAD)

    def losses(self) -> dict[int, float]:
        return {r.seed: float(r.final_val_loss) for r in self.rows if r.ok}  # type: ignore[arg-type]


@dataclass
class StableRange:
    """The stable learning rates of one variant in one facet."""

    variant: str
    facet: dict[str, Any]
    lrs: list[float]  # every learning rate of the grid, ascending
    stable: list[float]
    threshold: float  # (1 + X/100) x the variant's best mean loss
    max_not_diverged: float | None  # the highest lr with no diverged seed

    @property
    def width(self) -> float:
        if not self.stable:
            return 0.0
        return max(self.stable) / min(self.stable)

    @property
    def contiguous(self) -> bool:
        if not self.stable:
            return True
        idx = [self.lrs.index(x) for x in self.stable]
        return max(idx) - min(idx) + 1 == len(idx)


@dataclass
class BestVsBest:
    variant: str
    best: Cell
    baseline: Cell
    rel_improvement: float
    test: PairedTest


def cells(rows: Sequence[RunRow], record: dict[str, Any]) -> list[Cell]:
    """One cell per (variant, point), in the record's order (variant-major, grid order)."""
    arm = {v["name"]: v for v in record["variants"]}
    out: dict[str, Cell] = {}
    for r in rows:
        v = arm[r.variant]
        cell = out.setdefault(r.variant, Cell(v["sweep_variant"], dict(v["sweep_point"]), []))
        cell.rows.append(r)
    for c in out.values():
        c.mean, c.std = mean_std(list(c.losses().values()))
        for r in c.rows:
            c.counts[r.status] = c.counts.get(r.status, 0) + 1
    return list(out.values())


def lr_key(grid: dict[str, list[Any]]) -> str:
    """The x axis: ``train.lr`` when swept, else the first grid key."""
    return LR_KEY if LR_KEY in grid else next(iter(grid))


def facets(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the grid keys other than the x axis (``[{}]`` when there are none)."""
    from attnlab.experiments.sweeps.grid import grid_points

    x = lr_key(grid)
    rest = {k: v for k, v in grid.items() if k != x}
    return grid_points(rest) if rest else [{}]


def in_facet(cell: Cell, facet: dict[str, Any]) -> bool:
    return all(repr(cell.point.get(k)) == repr(v) for k, v in facet.items())


def best_cell(cs: Sequence[Cell], variant: str) -> Cell | None:
    """The variant's complete cell with the lowest mean final loss (file order breaks ties)."""
    ok = [c for c in cs if c.variant == variant and c.complete]
    return min(ok, key=lambda c: c.mean) if ok else None


def stable_ranges(
    cs: Sequence[Cell], grid: dict[str, list[Any]], variant: str, within_pct: float
) -> list[StableRange]:
    """The stable learning rates of ``variant`` in every facet (module docstring)."""
    x = lr_key(grid)
    lrs = sorted(float(v) for v in grid[x])
    best = best_cell(cs, variant)
    threshold = best.mean * (1 + within_pct / 100) if best is not None else -math.inf
    out = []
    for facet in facets(grid):
        mine = [c for c in cs if c.variant == variant and in_facet(c, facet)]
        stable = sorted(
            float(c.point[x]) for c in mine if c.complete and c.n_bad == 0 and c.mean <= threshold
        )
        alive = [
            float(c.point[x])
            for c in mine
            if (c.n_ok or c.counts.get("pruned")) and not c.counts.get("diverged")
        ]
        out.append(StableRange(variant, facet, lrs, stable, threshold, max(alive, default=None)))
    return out


def best_vs_best(cs: Sequence[Cell], variants: Sequence[str], baseline: str) -> list[BestVsBest]:
    """Every other variant's best cell against the baseline's best, paired by seed."""
    base = best_cell(cs, baseline)
    if base is None:
        return []
    b = base.losses()
    out = []
    for v in variants:
        if v == baseline:
            continue
        best = best_cell(cs, v)
        if best is None:
            continue
        mine = best.losses()
        seeds = sorted(set(b) & set(mine))
        test = paired_test([b[s] for s in seeds], [mine[s] for s in seeds])
        rel = relative_improvement(base.mean, best.mean)
        out.append(BestVsBest(v, best, base, rel, test))
    return out
