"""The ladder's figures: final loss against size per variant with the fitted curves and their
bands, and the gap between two variants against size; log-x, with the sizes beyond the ladder
shaded and labelled "extrapolation".

Each ``*_figure`` function returns the matplotlib Figure (what the tests read: its lines, bands
and labels); the plain functions write it as a PNG (:func:`~.plots.save`) and return the path. A
fit that is not trusted (:mod:`attnlab.experiments.scaling.trust`) is drawn as its points only,
its legend entry saying so: no curve is drawn that the report would not print.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from attnlab.experiments.reports.plots import palette, save
from attnlab.experiments.scaling.fit import ScalingFit
from attnlab.experiments.scaling.gap import GapFit

#: points per fitted curve (log-spaced)
CURVE_POINTS = 200
EXTRAPOLATION = "extrapolation"


def _span(trained_hi: float, targets: Mapping[str, float] | None) -> float:
    """The right end of the x-axis: the largest target, or a little past the ladder."""
    return max([trained_hi * 1.5, *((targets or {}).values())])


def _mark_extrapolation(
    ax: Axes, lo: float, hi: float, targets: Mapping[str, float] | None
) -> None:
    """Shade [lo, hi] as extrapolation and draw a dotted line at each named size."""
    if hi > lo:
        ax.axvspan(lo, hi, color="0.5", alpha=0.08, lw=0)
        ax.text(
            lo * 1.05,
            0.98,
            EXTRAPOLATION,
            transform=ax.get_xaxis_transform(),
            va="top",
            ha="left",
            fontsize=8,
            color="0.35",
        )
    for label, x in (targets or {}).items():
        ax.axvline(x, color="0.4", ls=":", lw=0.9)
        ax.text(
            x,
            0.02,
            f" {label}",
            transform=ax.get_xaxis_transform(),
            rotation=90,
            va="bottom",
            ha="right",
            fontsize=8,
            color="0.35",
        )


def _curve_x(lo: float, top: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """Log-spaced x over the ladder [lo, top] and beyond it (top, hi]."""
    inside = np.geomspace(lo, top, CURVE_POINTS)
    beyond = np.geomspace(top, hi, CURVE_POINTS) if hi > top else np.array([])
    return inside, beyond


def loss_vs_size_figure(
    fits: Mapping[str, ScalingFit], targets: Mapping[str, float] | None = None
) -> Figure:
    """Every run's final loss (points), each trusted fit (solid over the ladder, dashed beyond)
    with its bootstrap band; log-x."""
    fig = Figure(figsize=(7.5, 4.8))
    ax = fig.add_subplot()
    colors = palette(list(fits))
    lo = min(f.data.x.min() for f in fits.values())
    top = max(f.data.x.max() for f in fits.values())
    hi = _span(top, targets)
    var = next(iter(fits.values())).var
    for name, f in fits.items():
        xs, ys = f.data.points()
        label = name if f.trustworthy else f"{name} (no trusted fit)"
        ax.scatter(xs, np.exp(ys), s=14, color=colors[name], alpha=0.7, label=label, zorder=3)
        if not f.trustworthy:
            continue
        inside, beyond = _curve_x(lo, top, hi)
        band = f.predict(np.concatenate([inside, beyond]))
        ax.fill_between(band.x, band.lo, band.hi, color=colors[name], alpha=0.15, lw=0)
        ax.plot(inside, f.predict(inside).mid, color=colors[name], lw=1.6)
        if beyond.size:
            ax.plot(beyond, f.predict(beyond).mid, color=colors[name], lw=1.4, ls="--")
    _mark_extrapolation(ax, top, hi, targets)
    ax.set_xscale("log")
    ax.set_xlabel(f"{var} ({'non-embedding parameters' if var == 'N' else 'training FLOPs'})")
    ax.set_ylabel("final validation loss (nats/token)")
    level = 100 * next(iter(fits.values())).settings.level
    ax.set_title(f"Loss vs {var}: L = E + A {var}^-alpha, {level:g}% bootstrap bands")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper right")
    return fig


def gap_vs_size_figure(gap: GapFit, targets: Mapping[str, float] | None = None) -> Figure:
    """The observed paired gap per rung (points), its trend line, and the fitted gap (solid over
    the ladder, dashed beyond) with its band; the named sizes with their intervals."""
    fig = Figure(figsize=(7.5, 4.5))
    ax = fig.add_subplot()
    b, v, var = gap.baseline.name, gap.variant.name, gap.var
    lo, top = float(gap.x.min()), float(gap.x.max())
    hi = _span(top, targets)
    ax.axhline(0.0, color="black", lw=0.8)
    ax.scatter(
        gap.x, gap.observed, color="C0", s=22, zorder=3, label="observed (mean of paired seeds)"
    )
    ci = gap.slope_interval()
    if gap.slope is not None and np.isfinite(gap.slope) and gap.trend() is not None and ci:
        lx = np.log10(gap.x)
        ok = np.isfinite(gap.observed)
        line = gap.observed[ok].mean() + gap.slope * (lx - lx[ok].mean())
        ax.plot(
            gap.x,
            line,
            color="C0",
            lw=1.0,
            ls="-.",
            label=f"trend {gap.slope:+.4f} nats/decade [{ci[0]:+.4f}, {ci[1]:+.4f}]",
        )
    if gap.baseline.trustworthy and gap.variant.trustworthy:
        inside, beyond = _curve_x(lo, top, hi)
        band = gap.band(np.concatenate([inside, beyond]))
        ax.fill_between(band.x, band.lo, band.hi, color="C1", alpha=0.18, lw=0)
        ax.plot(inside, gap.band(inside).mid, color="C1", lw=1.6, label="fitted gap, equal size")
        if beyond.size:
            ax.plot(beyond, gap.band(beyond).mid, color="C1", lw=1.4, ls="--")
        for p in gap.at(targets or {}):
            ax.errorbar(
                [p.x],
                [p.mid],
                yerr=[[p.mid - p.lo], [p.hi - p.mid]],
                color="C3",
                fmt="o",
                ms=4,
                capsize=3,
                label=f"{p.label}{' (extrapolation)' if p.extrapolated else ''}",
            )
    else:
        ax.text(
            0.5,
            0.5,
            "no trusted fit: no fitted gap",
            transform=ax.transAxes,
            ha="center",
            color="0.35",
        )
    _mark_extrapolation(ax, top, hi, targets)
    ax.set_xscale("log")
    ax.set_xlabel(var)
    ax.set_ylabel(f"L({b}) - L({v}), nats (+: {v} better)")
    ax.set_title(f"Gap vs {var}: {v} against {b}")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="best")
    return fig


def loss_vs_size(
    fits: Mapping[str, ScalingFit], path: Path, targets: Mapping[str, float] | None = None
) -> Path:
    """:func:`loss_vs_size_figure` written to ``path``."""
    return save(loss_vs_size_figure(fits, targets), path)


def gap_vs_size(gap: GapFit, path: Path, targets: Mapping[str, float] | None = None) -> Path:
    """:func:`gap_vs_size_figure` written to ``path``."""
    return save(gap_vs_size_figure(gap, targets), path)
