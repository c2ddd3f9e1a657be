"""The report's figures, drawn with matplotlib's object API on the Agg canvas (no display, no
global backend switch). Every function writes one PNG and returns its path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from attnlab.experiments.reports.curves import Band

DPI = 110


def save(fig: Figure, path: Path) -> Path:
    """Write ``fig`` to ``path`` (its folder made) and return the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    return path


def palette(names: Sequence[str]) -> dict[str, tuple]:
    """One tab10 colour per name, in the order given."""
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return {n: cmap(i % 10) for i, n in enumerate(names)}


def val_loss_curves(bands: Mapping[str, Band], baseline: str, path: Path) -> Path:
    """Validation loss against step: mean over seeds, shaded min-max."""
    fig = Figure(figsize=(7.5, 4.5))
    ax = fig.add_subplot()
    colors = palette(list(bands))
    tops = []
    for name, b in bands.items():
        if not len(b.steps):
            continue
        lw = 2.2 if name == baseline else 1.4
        label = f"{name} (baseline)" if name == baseline else name
        ax.plot(b.steps, b.mean, color=colors[name], lw=lw, label=label)
        ax.fill_between(b.steps, b.lo, b.hi, color=colors[name], alpha=0.18, lw=0)
        # the top shows every curve's end and everyone's second point, not the first steps
        tops.append(float(b.mean[-1]))
        if len(b.mean) >= 3:
            tops.append(float(b.mean[1]))
    lows = [float(np.min(b.lo)) for b in bands.values() if len(b.lo)]
    if tops and lows:
        lo, hi = min(lows), max(tops)
        if hi > lo:
            ax.set_ylim(lo - 0.03 * (hi - lo), hi + 0.03 * (hi - lo))
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss (nats/token)")
    ax.set_title("Validation loss (mean over seeds, shaded: min-max)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save(fig, path)


def relative_improvement_curves(bands: Mapping[str, Band], baseline: str, path: Path) -> Path:
    """100 (baseline - variant) / baseline at each validation step; positive = better."""
    fig = Figure(figsize=(7.5, 4.0))
    ax = fig.add_subplot()
    colors = palette([baseline, *bands])
    for name, b in bands.items():
        if not len(b.steps):
            continue
        ax.plot(b.steps, b.mean, color=colors[name], lw=1.6, label=name)
        ax.fill_between(b.steps, b.lo, b.hi, color=colors[name], alpha=0.18, lw=0)
    ax.axhline(0.0, color="black", lw=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("improvement over baseline (%)")
    ax.set_title(f"Relative improvement over {baseline} (positive = lower loss)")
    ax.grid(alpha=0.3)
    if bands:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save(fig, path)


def params_vs_loss(
    points: Mapping[str, tuple[int, Sequence[float]]], baseline: str, path: Path
) -> Path:
    """Non-embedding parameters against final validation loss (dots: seeds; cross: mean)."""
    fig = Figure(figsize=(7.0, 4.5))
    ax = fig.add_subplot()
    colors = palette(list(points))
    for name, (n, losses) in points.items():
        if not losses:
            continue
        x = n / 1e6
        ax.scatter([x] * len(losses), losses, color=colors[name], s=22, alpha=0.7)
        ax.scatter(
            [x],
            [float(np.mean(losses))],
            color=colors[name],
            marker="X",
            s=90,
            edgecolor="black",
            linewidth=0.6,
            label=f"{name} (baseline)" if name == baseline else name,
        )
    ax.set_xlabel("non-embedding parameters (M)")
    ax.set_ylabel("final validation loss")
    ax.set_title("Parameters vs final loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save(fig, path)


def layer_stat_bars(norms: Mapping[str, np.ndarray], path: Path, title: str) -> Path:
    """A per-layer statistic (e.g. the content skip's ``||W_skip||_F``, seed 000's Figure 2):
    bars = mean over seeds, whiskers = range. ``norms[variant]`` is ``[seeds, layers]``."""
    fig = Figure(figsize=(max(6.0, 0.5 * max(a.shape[1] for a in norms.values()) + 3), 4.0))
    ax = fig.add_subplot()
    colors = palette(list(norms))
    width = 0.8 / max(len(norms), 1)
    for i, (name, a) in enumerate(norms.items()):
        layers = np.arange(a.shape[1])
        mean = a.mean(0)
        err = np.stack([mean - a.min(0), a.max(0) - mean])
        ax.bar(
            layers + (i - (len(norms) - 1) / 2) * width,
            mean,
            width,
            yerr=err,
            color=colors[name],
            label=name,
            capsize=2,
        )
    ax.set_xlabel("layer")
    ax.set_ylabel(title)
    ax.set_title(f"{title} per layer (final checkpoint)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save(fig, path)


def _color_max(p: np.ndarray) -> float:
    """Colour scale top: the 99th percentile of the causal part below the first few queries, whose
    rows are near-one-hot by construction and would wash everything else out."""
    rows = p[min(4, p.shape[0] - 1) :]
    vals = rows[rows > 0]
    top = float(np.quantile(vals, 0.99)) if vals.size else float(p.max())
    return max(top, 1e-6)


def attention_grid(maps: Sequence[np.ndarray], title: str, path: Path, virtual: bool) -> Path:
    """One panel per (layer, head): the head's attention probabilities (query rows, key cols),
    coloured from 0 to the 99th percentile (:func:`_color_max`)."""
    n_layers = len(maps)
    n_heads = max(m.shape[0] for m in maps)
    fig = Figure(figsize=(1.6 * n_heads + 0.6, 1.6 * n_layers + 0.8))
    head = "virtual head" if virtual else "head"
    for li, m in enumerate(maps):
        for h in range(m.shape[0]):
            ax = fig.add_subplot(n_layers, n_heads, li * n_heads + h + 1)
            ax.imshow(
                m[h],
                cmap="viridis",
                vmin=0.0,
                vmax=_color_max(m[h]),
                interpolation="nearest",
            )
            ax.set_xticks([])
            ax.set_yticks([])
            if li == 0:
                ax.set_title(f"{head} {h}", fontsize=8)
            if h == 0:
                ax.set_ylabel(f"layer {li}", fontsize=8)
    fig.suptitle(title, fontsize=9)
    return save(fig, path)


def head_weight_bars(
    weights: Sequence[np.ndarray], title: str, path: Path, labels: Sequence[str]
) -> Path:
    """Per-head values of each layer (e.g. the mean identity-head weights; ``labels`` name the
    bars, the last one drawn in black)."""
    n_layers = len(weights)
    n = len(weights[0])
    fig = Figure(figsize=(max(6.0, 0.35 * n * n_layers + 2), 3.8))
    ax = fig.add_subplot()
    width = 0.8 / n
    from matplotlib import colormaps

    cmap = colormaps["tab20"]
    for h in range(n):
        vals = [float(w[h]) for w in weights]
        color = "black" if h == n - 1 else cmap(h % 20)
        ax.bar(
            np.arange(n_layers) + (h - (n - 1) / 2) * width,
            vals,
            width,
            color=color,
            label=labels[h],
        )
    ax.axhline(0.0, color="black", lw=0.6)
    ax.set_xticks(np.arange(n_layers), [f"layer {i}" for i in range(n_layers)])
    ax.set_ylabel("mean head weight")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3, axis="y")
    return save(fig, path)


def train_stat_curves(bands: Mapping[str, Band], path: Path, title: str) -> Path:
    """A part statistic against step per variant: mean over seeds, shaded min-max."""
    fig = Figure(figsize=(7.5, 4.0))
    ax = fig.add_subplot()
    colors = palette(list(bands))
    for name, b in bands.items():
        if not len(b.steps):
            continue
        ax.plot(b.steps, b.mean, color=colors[name], lw=1.6, label=name)
        ax.fill_between(b.steps, b.lo, b.hi, color=colors[name], alpha=0.18, lw=0)
    ax.set_xlabel("step")
    ax.set_ylabel(title)
    ax.set_title(f"{title} over training (mean over layers and seeds, shaded: seed min-max)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save(fig, path)
