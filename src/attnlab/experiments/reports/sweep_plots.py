"""The sweep report's figures (matplotlib object API, Agg canvas, like :mod:`.plots`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from attnlab.experiments.reports.curves import Band
from attnlab.experiments.reports.plots import palette, save
from attnlab.experiments.reports.sweep_analysis import Cell, facets, in_facet, lr_key
from attnlab.experiments.sweeps.grid import format_value, short_names


def facet_title(facet: Mapping[str, Any]) -> str:
    names = short_names(list(facet))
    return ", ".join(f"{names[k]} = {format_value(v)}" for k, v in facet.items()) or "all runs"


def loss_vs_lr(
    cells: Sequence[Cell],
    grid: dict[str, list[Any]],
    variants: Sequence[str],
    baseline: str,
    path: Path,
) -> Path:
    """Final validation loss against the learning rate (log x), one panel per facet (e.g. weight
    decay), one line per variant: mean over the seeds that finished, bars = min-max over seeds.
    A point with a diverged seed gets an ``x`` at the top of the panel, a pruned one a ``v``;
    the line joins only the points where every seed finished."""
    x_key = lr_key(grid)
    fs = facets(grid)
    fig = Figure(figsize=(5.2 * len(fs) + 1.8, 4.3))
    colors = palette(list(variants))
    finite = [float(r.final_val_loss) for c in cells for r in c.rows if r.ok]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
    pad = 0.06 * max(hi - lo, 1e-3)
    top = hi + 2.5 * pad
    axes = []
    for i, facet in enumerate(fs):
        ax = fig.add_subplot(1, len(fs), i + 1, sharey=axes[0] if axes else None)
        axes.append(ax)
        n_var = max(len(variants), 1)
        for j, v in enumerate(variants):
            mine = sorted(
                (c for c in cells if c.variant == v and in_facet(c, facet)),
                key=lambda c: float(c.point[x_key]),
            )
            if not mine:
                continue
            xs = np.array([float(c.point[x_key]) for c in mine])
            # a small horizontal offset per variant keeps markers at one lr apart
            shift = 1.0 + 0.07 * (j - (n_var - 1) / 2)
            ok = [c for c in mine if c.complete]
            lw = 2.2 if v == baseline else 1.5
            label = f"{v} (baseline)" if v == baseline else v
            ax.plot(
                [float(c.point[x_key]) * shift for c in ok],
                [c.mean for c in ok],
                "-o",
                color=colors[v],
                lw=lw,
                ms=4,
                label=label,
            )
            for c, x in zip(mine, xs * shift):
                losses = list(c.losses().values())
                if losses:
                    ax.vlines(x, min(losses), max(losses), color=colors[v], lw=1.0)
                    if not c.complete:
                        ax.plot([x], [float(np.mean(losses))], "o", mfc="none", color=colors[v])
                if c.counts.get("diverged"):
                    ax.plot([x], [top], "x", color=colors[v], ms=9, mew=2)
                elif c.counts.get("pruned"):
                    ax.plot([x], [top], "v", color=colors[v], ms=7)
        ax.axhline(top - pad, color="grey", lw=0.5, ls=":")
        ax.set_xscale("log")
        ax.set_xlabel(x_key)
        ax.set_title(facet_title(facet), fontsize=10)
        ax.grid(alpha=0.3, which="both")
        if i == 0:
            ax.set_ylabel("final validation loss (mean over seeds)")
    axes[0].set_ylim(lo - pad, top + pad)
    handles, labels = axes[0].get_legend_handles_labels()
    from matplotlib.lines import Line2D

    handles += [
        Line2D([], [], ls="", marker="x", color="black", ms=8, mew=2),
        Line2D([], [], ls="", marker="v", color="black", ms=7),
        Line2D([], [], ls="", marker="o", mfc="none", color="black"),
    ]
    labels += ["a seed diverged (above the line)", "pruned", "some seeds only"]
    axes[-1].legend(handles, labels, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle("Final loss vs learning rate (bars: min-max over seeds)", fontsize=11)
    return save(fig, path)


def curves_by_lr(
    bands: Mapping[tuple[str, int], Mapping[float, Band]],
    variants: Sequence[str],
    n_facets: int,
    titles: Sequence[str],
    x_key: str,
    path: Path,
) -> Path:
    """Validation loss along training: one panel per (variant, facet), one line per learning
    rate (mean over seeds; a diverged run's curve stops where it diverged)."""
    from matplotlib import colormaps
    from matplotlib.colors import LogNorm

    all_lrs = sorted({lr for b in bands.values() for lr in b})
    norm = LogNorm(min(all_lrs), max(all_lrs)) if len(all_lrs) > 1 else None
    cmap = colormaps["viridis"]
    fig = Figure(figsize=(4.2 * n_facets + 1.5, 3.0 * len(variants) + 0.6))
    finite = [float(v) for b in bands.values() for band in b.values() for v in band.mean]
    ymax = float(np.quantile(finite, 0.9)) if finite else 1.0
    ymin = min(finite) if finite else 0.0
    ax0 = None
    for i, v in enumerate(variants):
        for j in range(n_facets):
            ax = fig.add_subplot(len(variants), n_facets, i * n_facets + j + 1, sharey=ax0)
            ax0 = ax0 or ax
            for lr, band in sorted(bands.get((v, j), {}).items()):
                if not len(band.steps):
                    continue
                color = cmap(norm(lr)) if norm else cmap(0.5)
                ax.plot(band.steps, band.mean, color=color, lw=1.2, label=f"{lr:g}")
            ax.set_title(f"{v}: {titles[j]}", fontsize=9)
            ax.grid(alpha=0.3)
            if i == len(variants) - 1:
                ax.set_xlabel("step")
            if j == 0:
                ax.set_ylabel("val loss")
    if ax0 is not None and finite:
        ax0.set_ylim(ymin - 0.03 * (ymax - ymin), ymax + 0.1 * (ymax - ymin))
    if norm is not None:
        from matplotlib.cm import ScalarMappable

        sm = ScalarMappable(norm=norm, cmap=cmap)
        fig.colorbar(sm, ax=fig.axes, label=x_key, shrink=0.8)
    return save(fig, path)


def fmt_lr(x: float | None) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:g}"
