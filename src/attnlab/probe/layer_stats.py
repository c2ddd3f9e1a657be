"""The injected parts' declared per-layer statistics (``Part.layer_stats``), as files.

A probe reports, after training, every statistic its injected parts declare (the content skip's
``content_skip_norm`` = ||W_skip||_F, seed 000's Figure 2; a plugin part's own), read through
:meth:`attnlab.probe.inject.Injection.layer_stats`. Per statistic ``KEY``, under ``DIR/layer_stats/``:
``KEY.csv`` (``layer`` and one column per method), ``KEY.md`` (the same table) and ``KEY.png``
(grouped bars, layer on x). A run directory holds its own method's column; an experiment
directory one column per method, and its report a section per statistic with the part's own
sentence on what it measures (``Part.layer_stats_doc``). Nothing here names a part.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from pathlib import Path

from attnlab.base.atomic import atomic_write_bytes

FOLDER = "layer_stats"
#: one statistic: method label -> one value per layer (None: not measured in that layer)
Series = Mapping[str, Sequence[float | None]]
#: every statistic: key -> its series
Stats = Mapping[str, Series]


def collect(per_method: Mapping[str, Mapping[str, Sequence[float | None]]]) -> dict[str, Series]:
    """``{method: {key: values}}`` -> ``{key: {method: values}}``, dropping all-None series."""
    out: dict[str, dict[str, Sequence[float | None]]] = {}
    for method, stats in per_method.items():
        for key, values in stats.items():
            if any(v is not None for v in values):
                out.setdefault(key, {})[method] = values
    return out


def title(key: str) -> str:
    """``content_skip_norm`` -> ``content skip norm`` (as the compare report names it)."""
    return key.replace("_", " ")


def table_rows(series: Series) -> list[dict[str, object]]:
    """One row per layer: ``layer`` and one column per method."""
    depth = max((len(v) for v in series.values()), default=0)
    return [
        {"layer": i, **{m: (v[i] if i < len(v) else None) for m, v in series.items()}}
        for i in range(depth)
    ]


def to_csv(series: Series) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=["layer", *series], lineterminator="\n")
    w.writeheader()
    for row in table_rows(series):
        w.writerow(
            {
                k: ("" if v is None else (f"{v:.6g}" if isinstance(v, float) else v))
                for k, v in row.items()
            }
        )
    return buf.getvalue()


def to_markdown(series: Series) -> str:
    """Layers as rows, one column per method."""
    cols = ["layer", *series]
    lines = ["| " + " | ".join(cols) + " |"]
    lines.append("|" + "|".join("---:" for _ in cols) + "|")
    for row in table_rows(series):
        cells = [str(row["layer"])] + ["" if row[m] is None else f"{row[m]:.4f}" for m in series]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(series: Series, path: Path, key: str) -> None:
    """Grouped bars, layer on x, the statistic on y (PNG, matplotlib's Agg backend)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    bars = {m: [0.0 if x is None else x for x in v] for m, v in series.items()}
    depth = max((len(v) for v in bars.values()), default=0)
    width = 0.8 / max(1, len(bars))
    fig, ax = plt.subplots(figsize=(max(4.0, 0.35 * depth + 2), 3.2), dpi=120)
    for k, (m, v) in enumerate(bars.items()):
        ax.bar([i - 0.4 + width * (k + 0.5) for i in range(len(v))], v, width, label=m)
    ax.set_xticks(range(0, depth, max(1, depth // 16)))
    ax.set_xlabel("layer")
    ax.set_ylabel(title(key))
    ax.set_title(f"{title(key)} by layer")
    if len(bars) > 1:
        ax.legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def write_layer_stats(stats: Stats, out_dir: Path) -> list[Path]:
    """``layer_stats/KEY.{csv,md,png}`` under ``out_dir`` for every statistic with a value."""
    paths: list[Path] = []
    for key, series in stats.items():
        series = {m: v for m, v in series.items() if any(x is not None for x in v)}
        if not series:
            continue
        folder = Path(out_dir) / FOLDER
        csv_path, md_path, png_path = (folder / f"{key}{s}" for s in (".csv", ".md", ".png"))
        atomic_write_bytes(csv_path, to_csv(series).encode())
        atomic_write_bytes(md_path, to_markdown(series).encode())
        plot(series, png_path, key)
        paths += [csv_path, md_path, png_path]
    return paths


def report_section(stats: Stats, docs: Mapping[str, str]) -> str:
    """Markdown: per statistic a heading, the part's sentence, the table and the plot."""
    lines: list[str] = []
    for key, series in stats.items():
        name = title(key)
        lines += [f"## {name[:1].upper()}{name[1:]} per layer", ""]
        if docs.get(key):
            lines += [docs[key], ""]
        lines += [to_markdown(series), f"![{name}]({FOLDER}/{key}.png)", ""]
    return "\n".join(lines)
