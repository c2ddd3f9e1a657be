"""The bootstrap's replicates of a ladder: seeds resampled within rungs, optionally rungs too.

``seeds`` (the default): replicate b keeps every rung and every run's place and redraws each
run's log-loss as its rung's mean plus a deviation drawn with replacement from the pool of all
rungs' seed deviations (:meth:`LadderData.deviations`, each scaled by sqrt(k / (k - 1)) so it has
one run's variance). Pooling across rungs is what makes two seeds per rung enough: a rung's own
two seeds could only be redrawn as {a, a}, {a, b} or {b, b}, which halves the variance of their
mean. It assumes the seed noise of log L is the same at every size (the noise of a loss is
roughly proportional to it). The interval then says how far the curve moves when the seeds are
run again; a rung that sits off the curve for other reasons (a learning rate that stopped
transferring) is not noise of this kind and is flagged by :mod:`.trust`, not widened away.

``rungs``: replicate b first draws R rungs with replacement (at least three distinct sizes, so
three parameters can be fitted; redrawn otherwise), then each drawn rung's seeds as above. It
adds the spread between rungs to the interval: honest when rungs scatter around the curve, wide
with five or six of them.

Paired variants: :class:`Draws` are made once from the layout (which rungs, which pool entries)
and applied to each variant's own losses, so a replicate redraws seed k of the variant and seed k
of the baseline together, as ``compare`` pairs them (the same batches). Seeded: the same
``seed`` gives the same replicates. Cost: O(B R S) memory and time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from attnlab.experiments.scaling.data import LadderData


@dataclass(frozen=True)
class Draws:
    """What replicate b reads: ``rung`` [B, R] (the rung in each place) and ``pool`` [B, R, S]
    (the pool entry whose deviation each run gets); ``pool_at`` [M, 2] lists the pool's (rung,
    seed-column) positions."""

    rung: np.ndarray
    pool: np.ndarray
    pool_at: np.ndarray


@dataclass(frozen=True)
class Replicates:
    """B resampled ladders: ``x``, ``y`` (log-losses, 0 where masked), ``mask``, [B, R, S]."""

    x: np.ndarray
    y: np.ndarray
    mask: np.ndarray

    def flat(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(x, y, mask) as [B, R * S] points."""
        B = self.mask.shape[0]
        return self.x.reshape(B, -1), self.y.reshape(B, -1), self.mask.reshape(B, -1)


def draw(
    mask: np.ndarray,
    n: int,
    seed: int,
    scheme: Literal["seeds", "rungs"] = "seeds",
) -> Draws | None:
    """Draws for a ladder with this [R, S] ``mask`` of finite runs; None when no rung has two
    seeds (there is no seed noise to resample)."""
    k = mask.sum(axis=1)
    pool_at = np.argwhere(mask & (k[:, None] > 1))
    if len(pool_at) == 0:
        return None
    rng = np.random.default_rng(seed)
    R, S = mask.shape
    live = np.flatnonzero(k > 0)
    if scheme == "rungs":
        rung = rng.choice(live, size=(n, R))
        need = min(3, len(live))
        for _ in range(1000):
            few = np.array([len(set(row)) < need for row in rung])
            if not few.any():
                break
            rung[few] = rng.choice(live, size=(int(few.sum()), R))
    else:
        rung = np.broadcast_to(np.arange(R), (n, R)).copy()
    pool = rng.integers(0, len(pool_at), size=(n, R, S))
    return Draws(rung, pool, pool_at)


def replicate(data: LadderData, draws: Draws) -> Replicates:
    """Apply ``draws`` to one variant's losses (its layout must be the one they were drawn for)."""
    means = data.rung_means()
    dev = data.deviations()[draws.pool_at[:, 0], draws.pool_at[:, 1]]
    y = means[draws.rung][..., None] + dev[draws.pool]
    mask = data.mask[draws.rung]
    x = np.broadcast_to(data.x[draws.rung][..., None], mask.shape)
    return Replicates(x, np.where(mask, y, 0.0), mask)
