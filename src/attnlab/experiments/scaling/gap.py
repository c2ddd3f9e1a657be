"""The gap between two variants as a function of size, its trend and its extrapolation:
:func:`compare_scaling`.

The gap is ``g = L(baseline) - L(variant)`` in nats (positive: the variant has the lower loss),
read two ways:

- **the trend, model-free**: at each rung the paired gap ``g_r`` (mean over the seeds both ran of
  ``L_b,s - L_v,s``: seed s of both read the same batches) is regressed on ``log10 x_r`` by least
  squares (``x_r`` the geometric mean of the two variants' sizes at that rung). The slope, in nats
  per decade of x, and its bootstrap interval give the verdict: the gap **grows** with x when the
  whole interval is above 0, **shrinks** when it is below, and **is flat** (no trend resolved)
  when it holds 0. A line, not the power laws, so the verdict does not hang on the curves' form.
- **the fitted gap** ``L_b(x) - L_v(x)`` from the two power laws, at equal x, with the band of
  the paired bootstrap curves; at sizes beyond the ladder (GPT-2's 124M, 1B) it is marked as
  extrapolation and given only when both fits are trusted.

The bootstrap is paired when both variants ran the same seeds at every rung: the same draws
(:mod:`.resample`) redraw seed k of both together, so the noise they share cancels in the gap as
it does in ``compare``. Otherwise each is resampled on its own, and the verdict says "unpaired".
Cost: two fits (:mod:`.fit`) and an O(B R S) pass for the slopes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from attnlab.experiments.scaling import trust
from attnlab.experiments.scaling.data import LadderData, RungLosses, ladder_data
from attnlab.experiments.scaling.fit import Band, ScalingFit, fit_scaling
from attnlab.experiments.scaling.resample import Draws, draw, replicate
from attnlab.experiments.scaling.settings import FitSettings

#: sizes a researcher asks about, named; values are given by the caller (sizes.py counts them)
TREND_WORDS = {1: "grows", 0: "is flat", -1: "shrinks"}


@dataclass(frozen=True)
class GapPoint:
    """The fitted gap at one named size, and whether that size lies outside the ladder."""

    label: str
    x: float
    mid: float
    lo: float
    hi: float
    extrapolated: bool


@dataclass
class GapFit:
    """Two variants' fits, the per-rung paired gaps and the slope of the gap in log10 x."""

    baseline: ScalingFit
    variant: ScalingFit
    paired: bool
    #: [R] the rung sizes of the trend (geometric mean of the two variants' sizes at each rung)
    x: np.ndarray
    #: [R] the observed paired gap at each rung (nats; NaN where no seed ran in both)
    observed: np.ndarray
    slope: float | None
    slope_boot: np.ndarray | None
    problems: list[str] = field(default_factory=list)

    @property
    def var(self) -> str:
        return self.variant.var

    def _q(self) -> tuple[float, float]:
        return self.variant._q()

    def slope_interval(self) -> tuple[float, float] | None:
        if self.slope_boot is None:
            return None
        lo, hi = np.percentile(self.slope_boot, self._q())
        return float(lo), float(hi)

    def trend(self) -> str | None:
        """ "grows", "is flat" or "shrinks" (None when the slope is not to be trusted)."""
        ci = self.slope_interval()
        if self.problems or ci is None:
            return None
        return TREND_WORDS[1 if ci[0] > 0 else -1 if ci[1] < 0 else 0]

    def band(self, xs: Sequence[float] | np.ndarray) -> Band:
        """The fitted gap ``L_b(x) - L_v(x)`` at ``xs`` with its bootstrap band."""
        xs = np.atleast_1d(np.asarray(xs, dtype=np.float64))
        b, v = self.baseline, self.variant
        nan = np.full_like(xs, np.nan)
        if b.curve is None or v.curve is None:
            return Band(xs, nan, nan, nan)
        mid = b.curve(xs) - v.curve(xs)
        if b.boot is None or v.boot is None:
            return Band(xs, mid, nan, nan)
        lo, hi = np.percentile(b.curves(xs) - v.curves(xs), self._q(), axis=0)
        return Band(xs, mid, lo, hi)

    def at(self, targets: Mapping[str, float]) -> list[GapPoint]:
        """The fitted gap at each named size; ``extrapolated`` outside the trained sizes."""
        lo_x = min(self.baseline.data.x.min(), self.variant.data.x.min())
        hi_x = max(self.baseline.data.x.max(), self.variant.data.x.max())
        band = self.band(list(targets.values()))
        return [
            GapPoint(
                label,
                float(x),
                float(band.mid[i]),
                float(band.lo[i]),
                float(band.hi[i]),
                not (lo_x <= x <= hi_x),
            )
            for i, (label, x) in enumerate(targets.items())
        ]

    def verdict(self) -> str:
        """One sentence: the gap grows / is flat / shrinks with x, slope [interval]; or why not."""
        b, v, var = self.baseline.name, self.variant.name, self.var
        head = f"{v} vs {b}: the gap L({b}) - L({v}) (positive: {v} better)"
        word = self.trend()
        if word is None:
            why = "; ".join(self.problems) or "no bootstrap interval"
            return f"{head}: no verdict on its trend with {var}: {why}"
        lo, hi = self.slope_interval() or (np.nan, np.nan)
        mean = float(np.nanmean(self.observed))
        level = f"{100 * self.variant.settings.level:g}%"
        how = (
            f"{self.variant.settings.resample} resampled, {'paired' if self.paired else 'unpaired'}"
        )
        sense = ""
        if word != TREND_WORDS[0] and mean != 0:
            lead = "advantage" if mean > 0 else "deficit"
            wider = (self.slope > 0) == (mean > 0)
            sense = f" (the {lead} of {v} {'widens' if wider else 'narrows'})"
        return (
            f"{head} {word} with {var}{sense}: slope {self.slope:+.4f} nats per decade of {var} "
            f"[{lo:+.4f}, {hi:+.4f}] ({level} bootstrap, {how}; mean gap over "
            f"{int(np.isfinite(self.observed).sum())} rungs {mean:+.4f} nats)"
        )

    def extrapolation(self, targets: Mapping[str, float]) -> str:
        """The fitted gap at each named size, marked as extrapolation; or why there is none."""
        bad = [f for f in (self.baseline, self.variant) if not f.trustworthy]
        if bad:
            why = "; ".join(f"{f.name}: {'; '.join(f.problems) or 'no fit'}" for f in bad)
            return f"no fitted gap at {', '.join(targets)}: {why}"
        top = max(self.baseline.data.x.max(), self.variant.data.x.max())
        parts = []
        for p in self.at(targets):
            where = (
                f"extrapolation, {p.x / top:.3g}x the largest rung"
                if p.extrapolated
                else "in range"
            )
            parts.append(
                f"at {p.label} ({self.var}={p.x:.3g}; {where}): {p.mid:+.4f} [{p.lo:+.4f}, "
                f"{p.hi:+.4f}] nats"
            )
        return "fitted gap " + "; ".join(parts)


def _paired_gaps(yb: np.ndarray, yv: np.ndarray, both: np.ndarray) -> np.ndarray:
    """[..., R] mean over the seeds both ran of exp(yb) - exp(yv) (NaN where none)."""
    diff = np.where(both, np.exp(yb) - np.exp(yv), 0.0)
    n = both.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, diff.sum(axis=-1) / np.maximum(n, 1), np.nan)


def _slopes(lx: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Least-squares slopes of g on lx along the last axis, NaN entries left out."""
    ok = np.isfinite(g)
    n = ok.sum(axis=-1)
    mx = np.where(ok, lx, 0).sum(-1) / np.maximum(n, 1)
    mg = np.where(ok, g, 0).sum(-1) / np.maximum(n, 1)
    dx = np.where(ok, lx - mx[..., None], 0)
    sxx = (dx * dx).sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(
            (n >= 2) & (sxx > 0), (dx * np.where(ok, g - mg[..., None], 0)).sum(-1) / sxx, np.nan
        )


def _layouts_match(b: LadderData, v: LadderData) -> bool:
    return b.y.shape == v.y.shape and b.seeds == v.seeds and np.array_equal(b.mask, v.mask)


def _draws(b: LadderData, v: LadderData, s: FitSettings) -> tuple[Draws | None, Draws | None, bool]:
    if _layouts_match(b, v):
        d = draw(b.mask, s.n_boot, s.seed, s.resample)
        return d, d, True
    return (
        draw(b.mask, s.n_boot, s.seed, s.resample),
        draw(v.mask, s.n_boot, s.seed + 1, s.resample),
        False,
    )


def compare_scaling(
    baseline: Sequence[RungLosses] | LadderData,
    variant: Sequence[RungLosses] | LadderData,
    settings: FitSettings | None = None,
    *,
    names: tuple[str, str] = ("baseline", "variant"),
    var: str = "N",
) -> GapFit:
    """Fit both variants (paired bootstrap when their runs line up) and the trend of their gap.

    Rungs are matched by rank: the i-th smallest rung of one is the i-th of the other (the
    ladder trains every variant at every rung; a parameter-changing variant's N differs a
    little at each)."""
    s = settings or FitSettings()
    b = baseline if isinstance(baseline, LadderData) else ladder_data(baseline)
    v = variant if isinstance(variant, LadderData) else ladder_data(variant)
    db, dv, paired = _draws(b, v, s)
    fb = fit_scaling(b, s, name=names[0], var=var, draws=db)
    fv = fit_scaling(v, s, name=names[1], var=var, draws=dv)
    problems = [
        f"{n}: {p}" for n, d in zip(names, (b, v)) for p in trust.ladder_problems(d, s, var)
    ]
    if b.y.shape[0] != v.y.shape[0]:
        problems.append(
            f"{names[0]} has {b.y.shape[0]} rungs and {names[1]} {v.y.shape[0]}; the gap is "
            "read rung by rung, so both need the same rungs"
        )
        nan = np.full(min(b.y.shape[0], v.y.shape[0]), np.nan)
        return GapFit(fb, fv, paired, nan, nan, None, None, problems)
    if b.seeds != v.seeds:
        vb = {s_: i for i, s_ in enumerate(v.seeds)}
        cols = [vb.get(s_) for s_ in b.seeds]
        yv = np.stack(
            [v.y[:, c] if c is not None else np.full(v.y.shape[0], np.nan) for c in cols], 1
        )
    else:
        yv = v.y
    both = np.isfinite(b.y) & np.isfinite(yv)
    x = np.sqrt(b.x * v.x)
    if both.any():
        observed = _paired_gaps(b.y, yv, both)
    else:  # no seed ran in both: the difference of the rung means
        observed = np.exp(b.rung_means()) - np.exp(v.rung_means())
    slope = float(_slopes(np.log10(x), observed))
    boot = None
    if db is not None and dv is not None and paired:
        rb, rv = replicate(b, db), replicate(v, dv)
        g = _paired_gaps(rb.y, rv.y, rb.mask & rv.mask)
        boot = _slopes(np.log10(x)[db.rung], g)
    elif db is not None and dv is not None:
        rb, rv = replicate(b, db), replicate(v, dv)
        g = np.nanmean(np.where(rb.mask, np.exp(rb.y), np.nan), -1) - np.nanmean(
            np.where(rv.mask, np.exp(rv.y), np.nan), -1
        )
        boot = _slopes(np.log10(x)[db.rung], g)
    if boot is not None:
        boot = boot[np.isfinite(boot)]
    return GapFit(fb, fv, paired, x, observed, slope, boot, problems)
