"""The injected parts' statistics over training (``Part.train_stats``), for the probe's report.

The shared loop writes them to every method's ``metrics.jsonl`` as ``part/KEY/LAYER`` and
``part/KEY`` (mean over layers). :func:`train_curves_section` plots each ``part/KEY`` against
step, one line per method (one run per method, so no seed band), into
``DIR/train_stats/KEY.png``, and returns the report's section. Nothing here names a part.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from attnlab.runs.rundir import read_metrics

FOLDER = "train_stats"


def curves(run_dirs: Mapping[str, str | Path]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """``{KEY: {method: [(step, value), ...]}}`` of every ``part/KEY`` (mean) column."""
    out: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for method, run_dir in run_dirs.items():
        for row in read_metrics(run_dir):
            for col, value in row.items():
                key = col[len("part/") :]
                if not col.startswith("part/") or "/" in key:
                    continue  # per-layer (part/KEY/LAYER) and per-expert columns: not plotted
                if isinstance(value, int | float):
                    out.setdefault(key, {}).setdefault(method, []).append(
                        (int(row["step"]), float(value))
                    )
    return out


def _plot(series: Mapping[str, Sequence[tuple[int, float]]], path: Path, key: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 3.6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for method, points in series.items():
        ax.plot([s for s, _ in points], [v for _, v in points], lw=1.6, label=method)
    ax.set_xlabel("step")
    ax.set_ylabel(key.replace("_", " "))
    ax.set_title(f"{key.replace('_', ' ')} over training (mean over layers)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")


def train_curves_section(
    out_dir: Path, run_dirs: Mapping[str, str | Path], docs: Mapping[str, str]
) -> str:
    """Write ``train_stats/KEY.png`` per statistic and return the markdown section ('' if none)."""
    lines: list[str] = []
    for key, series in curves(run_dirs).items():
        _plot(series, Path(out_dir) / FOLDER / f"{key}.png", key)
        name = key.replace("_", " ")
        lines += [f"## {name[:1].upper()}{name[1:]} over training", ""]
        if docs.get(key):
            lines += [docs[key], ""]
        lines += [
            "One line per method (the injected parts' `train_stats`, logged every "
            "`train.log_every` steps; mean over layers).",
            "",
            f"![{name} over training]({FOLDER}/{key}.png)",
            "",
        ]
    return "\n".join(lines)
