"""One variant's scaling curve with bootstrap intervals: :func:`fit_scaling`.

    L(x) = E + A x^-alpha        x = N (non-embedding parameters) or C (training FLOPs)

fitted through every finished run of every rung (seeds are replicates, not averaged first) by
:mod:`.power_law`; intervals are percentiles of the same fit on ``n_boot`` replicates of the
ladder (:mod:`.resample`: seeds within rungs by default), for E, A, alpha and for the predicted
loss at any x. The honesty checks of :mod:`.trust` run on the result; a fit with problems reports
them in place of its numbers (:meth:`ScalingFit.summary`). Cost: one fit from 150 starts, then
``n_boot`` fits from 4 starts each, batched (about a second for 1,000 replicates of 12 runs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from attnlab.experiments.scaling import trust
from attnlab.experiments.scaling.data import LadderData, RungLosses, ladder_data
from attnlab.experiments.scaling.power_law import PowerLaw, fit_one, fit_power_laws
from attnlab.experiments.scaling.resample import Draws, draw, replicate
from attnlab.experiments.scaling.settings import FitSettings

#: Huber's tuning constant: 95% efficiency under Gaussian noise
HUBER_K = 1.345
#: Hoffmann et al.'s threshold, used when there is no seed noise to scale it by
HOFFMANN_DELTA = 1e-3
PARAMETERS = ("E", "A", "alpha")


@dataclass(frozen=True)
class Band:
    """A prediction at sizes ``x``: the point fit's ``mid`` and the bootstrap interval."""

    x: np.ndarray
    mid: np.ndarray
    lo: np.ndarray
    hi: np.ndarray


@dataclass
class ScalingFit:
    """A variant's fitted curve, its bootstrap replicates and its problems."""

    name: str
    data: LadderData
    settings: FitSettings
    curve: PowerLaw | None
    #: [B, 3] the (E, A, alpha) of each bootstrap replicate; None without seed noise
    boot: np.ndarray | None
    delta: float
    var: str = "N"
    problems: list[str] = field(default_factory=list)

    @property
    def trustworthy(self) -> bool:
        return self.curve is not None and not self.problems

    def _q(self) -> tuple[float, float]:
        tail = 100 * (1 - self.settings.level) / 2
        return tail, 100 - tail

    def interval(self, name: str) -> tuple[float, float] | None:
        """The bootstrap interval of ``E``, ``A`` or ``alpha`` (None without replicates)."""
        if self.boot is None:
            return None
        lo, hi = np.percentile(self.boot[:, PARAMETERS.index(name)], self._q())
        return float(lo), float(hi)

    def predict(self, x: float | Sequence[float] | np.ndarray) -> Band:
        """L at ``x`` from the point fit, with the bootstrap interval (NaN without one)."""
        xs = np.atleast_1d(np.asarray(x, dtype=np.float64))
        if self.curve is None:
            nan = np.full_like(xs, np.nan)
            return Band(xs, nan, nan, nan)
        mid = self.curve(xs)
        if self.boot is None:
            return Band(xs, mid, np.full_like(xs, np.nan), np.full_like(xs, np.nan))
        curves = self.curves(xs)
        lo, hi = np.percentile(curves, self._q(), axis=0)
        return Band(xs, mid, lo, hi)

    def curves(self, xs: np.ndarray) -> np.ndarray:
        """[B, len(xs)] every replicate's L at ``xs``."""
        assert self.boot is not None
        E, A, al = (self.boot[:, i : i + 1] for i in range(3))
        return E + A * xs[None, :] ** -al

    def summary(self) -> str:
        """One sentence: the curve with its intervals, or why there is no trusted curve."""
        if not self.trustworthy:
            why = "; ".join(self.problems) or "no fit"
            return f"{self.name}: no trusted fit of L({self.var}): {why}"
        assert self.curve is not None
        parts = []
        for name in PARAMETERS:
            lo, hi = self.interval(name) or (math.nan, math.nan)
            parts.append(f"{name} = {getattr(self.curve, name):.4g} [{lo:.4g}, {hi:.4g}]")
        R, S = self.data.y.shape
        return (
            f"{self.name}: L({self.var}) = E + A {self.var}^-alpha with {', '.join(parts)} "
            f"({100 * self.settings.level:g}% bootstrap, {self.settings.resample} resampled, "
            f"{self.boot.shape[0] if self.boot is not None else 0} replicates; {R} rungs x "
            f"{S} seeds)"
        )


def huber_delta(data: LadderData, settings: FitSettings) -> float:
    """The Huber threshold: the setting, else 1.345 x the seed noise, else Hoffmann's 1e-3."""
    if settings.delta is not None:
        return settings.delta
    noise = data.noise()
    return HUBER_K * max(noise, trust.NOISE_FLOOR) if noise is not None else HOFFMANN_DELTA


def bootstrap(
    data: LadderData, curve: PowerLaw, draws: Draws, settings: FitSettings, delta: float
) -> np.ndarray:
    """[B, 3] (E, A, alpha) refitted on each replicate, warm-started at the point fit."""
    x, y, mask = replicate(data, draws).flat()
    x_ref = float(np.exp(np.log(data.x).mean()))
    start = np.broadcast_to(np.array([curve.E, curve.A, curve.alpha]), (x.shape[0], 3))
    params, _ = fit_power_laws(
        x,
        y,
        mask,
        x_ref=x_ref,
        loss=settings.loss,
        delta=delta,
        alpha_max=settings.alpha_max,
        starts=start,
    )
    return params


def fit_scaling(
    rungs: Sequence[RungLosses] | LadderData,
    settings: FitSettings | None = None,
    *,
    name: str = "variant",
    var: str = "N",
    draws: Draws | None = None,
) -> ScalingFit:
    """Fit ``L(var) = E + A var^-alpha`` over ``rungs`` with bootstrap intervals and checks.

    ``draws`` (from :func:`~.resample.draw` on this ladder's layout) replaces the fit's own, so
    two variants fitted with the same draws are resampled in pairs (:mod:`.gap`).
    """
    settings = settings or FitSettings()
    data = rungs if isinstance(rungs, LadderData) else ladder_data(rungs)
    problems = trust.ladder_problems(data, settings, var)
    delta = huber_delta(data, settings)
    xs, ys = data.points()
    if len(np.unique(xs)) < 3:
        return ScalingFit(name, data, settings, None, None, delta, var, problems)
    curve = fit_one(xs, ys, loss=settings.loss, delta=delta, alpha_max=settings.alpha_max)
    if draws is None:
        draws = draw(data.mask, settings.n_boot, settings.seed, settings.resample)
    boot = None if draws is None else bootstrap(data, curve, draws, settings, delta)
    fit = ScalingFit(name, data, settings, curve, boot, delta, var, problems)
    problems += trust.residual_problems(data, curve, settings, var)
    x_ref = float(np.exp(np.log(data.x).mean()))
    reducible = None
    intervals = None
    if boot is not None:
        intervals = {p: fit.interval(p) for p in ("E", "alpha")}
        red = boot[:, 1] * x_ref ** -boot[:, 2]
        lo, hi = np.percentile(red, fit._q())
        reducible = (curve.A * x_ref**-curve.alpha, float(lo), float(hi))
    problems += trust.parameter_problems(curve, intervals, reducible, settings)
    return fit
