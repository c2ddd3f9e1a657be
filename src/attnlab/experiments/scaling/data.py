"""A ladder's final losses for one variant, laid out for fitting: one row per rung, one column per
seed, in log space.

A rung is one model size ``x`` (``N``, non-embedding parameters, or ``C``, training FLOPs) with the
final validation loss of each seed. A run that diverged (a non-finite loss, or a seed named in
``diverged``) is kept as a diverged point: the fit leaves it out and says so
(:mod:`~attnlab.experiments.scaling.trust`), never silently.

Seed noise is measured within rungs: ``ybar_r`` is the mean log-loss of rung r over its ``k_r``
finite seeds, and the pooled standard deviation

    sigma^2 = sum_r sum_s (y_rs - ybar_r)^2 / sum_r (k_r - 1)

is the noise of one run's log-loss (rungs with one seed add nothing to it). Cost: O(R S).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from attnlab.base.errors import UserError


@dataclass(frozen=True)
class RungLosses:
    """One rung of one variant: its size ``x`` and the final validation loss of each seed."""

    x: float
    losses: Mapping[int, float]
    #: seeds whose run diverged (its loss, if any, is not used)
    diverged: frozenset[int] = field(default_factory=frozenset)


@dataclass(frozen=True)
class LadderData:
    """Rungs sorted by size: ``x`` [R], ``y`` [R, S] log-losses (NaN where a seed is missing or
    diverged), ``seeds`` [S] (the column of each seed), ``diverged`` as (x, seed) pairs."""

    x: np.ndarray
    y: np.ndarray
    seeds: tuple[int, ...]
    diverged: tuple[tuple[float, int], ...] = ()

    @property
    def mask(self) -> np.ndarray:
        """[R, S] True where a finite loss was measured."""
        return np.isfinite(self.y)

    @property
    def counts(self) -> np.ndarray:
        """[R] finite seeds per rung (``k_r``)."""
        return self.mask.sum(axis=1)

    @property
    def rungs(self) -> int:
        """Rungs with at least one finite loss (the ones a curve is fitted through)."""
        return int((self.counts > 0).sum())

    def rung_means(self) -> np.ndarray:
        """[R] mean log-loss over each rung's finite seeds (NaN for a rung with none)."""
        with np.errstate(invalid="ignore"):
            return np.nanmean(np.where(self.mask, self.y, np.nan), axis=1)

    def deviations(self) -> np.ndarray:
        """[R, S] each seed's log-loss minus its rung's mean, scaled by sqrt(k / (k - 1)) so
        that a deviation drawn from the pool has the variance of one run (0 where k < 2, NaN
        where no loss)."""
        k = self.counts.astype(np.float64)
        inflate = np.sqrt(np.where(k > 1, k / np.maximum(k - 1, 1), 0.0))
        return (self.y - self.rung_means()[:, None]) * inflate[:, None]

    def noise(self) -> float | None:
        """Pooled within-rung standard deviation of one run's log-loss; None without replicates."""
        dof = float(np.maximum(self.counts - 1, 0).sum())
        if dof == 0:
            return None
        sq = np.where(self.mask, (self.y - self.rung_means()[:, None]) ** 2, 0.0)
        return math.sqrt(float(sq.sum()) / dof)

    def points(self) -> tuple[np.ndarray, np.ndarray]:
        """The finite (x, log-loss) points, flattened."""
        xs = np.broadcast_to(self.x[:, None], self.y.shape)
        return xs[self.mask], self.y[self.mask]


def ladder_data(rungs: Sequence[RungLosses]) -> LadderData:
    """Lay out ``rungs`` (any order; sizes must be distinct and positive, losses positive)."""
    if not rungs:
        raise UserError("a scaling fit needs rungs; none were given")
    sizes = [float(r.x) for r in rungs]
    bad = [x for x in sizes if not (math.isfinite(x) and x > 0)]
    if bad:
        raise UserError(f"rung sizes must be positive numbers (N or C); got {bad[0]!r}")
    if len(set(sizes)) != len(sizes):
        dup = sorted({x for x in sizes if sizes.count(x) > 1})
        raise UserError(
            f"two rungs have the same size {dup[0]:g}; give each model size once, with its seeds"
        )
    order = sorted(range(len(rungs)), key=lambda i: sizes[i])
    seeds = tuple(sorted({s for r in rungs for s in (*r.losses, *r.diverged)}))
    col = {s: j for j, s in enumerate(seeds)}
    y = np.full((len(rungs), len(seeds)), np.nan)
    diverged: list[tuple[float, int]] = []
    for i, idx in enumerate(order):
        rung = rungs[idx]
        for s, loss in rung.losses.items():
            value = float(loss)
            if s in rung.diverged or not math.isfinite(value):
                continue
            if value <= 0:
                raise UserError(
                    f"rung {sizes[idx]:g}, seed {s}: loss {value!r} is not positive; a scaling "
                    "fit reads cross-entropy losses (nats per token)"
                )
            y[i, col[s]] = math.log(value)
        bad_seeds = set(rung.diverged) | {
            s for s, v in rung.losses.items() if not math.isfinite(float(v))
        }
        diverged += [(sizes[idx], s) for s in sorted(bad_seeds)]
    return LadderData(np.array([sizes[i] for i in order]), y, seeds, tuple(diverged))
