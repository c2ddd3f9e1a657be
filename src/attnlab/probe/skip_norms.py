"""Per-layer ||W_skip||_F after training: a table (markdown + CSV) and a bar plot (seed 000's
Figure 2: layer vs skip norm). At init ||W_skip||_F = 1e-4 * d in expectation (N(0, 1e-4) over d^2
entries), so any visible bar is learned. One or several methods per file (grouped bars)."""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from pathlib import Path

from attnlab.runs.atomic import atomic_write_bytes

SkipNorms = Mapping[str, Sequence[float | None]]


def table_rows(norms: SkipNorms) -> list[dict[str, object]]:
    """One row per layer: ``layer`` and one column per method."""
    depth = max((len(v) for v in norms.values()), default=0)
    return [
        {"layer": i, **{m: (v[i] if i < len(v) else None) for m, v in norms.items()}}
        for i in range(depth)
    ]


def to_csv(norms: SkipNorms) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=["layer", *norms], lineterminator="\n")
    w.writeheader()
    for row in table_rows(norms):
        w.writerow(
            {
                k: ("" if v is None else (f"{v:.6g}" if isinstance(v, float) else v))
                for k, v in row.items()
            }
        )
    return buf.getvalue()


def to_markdown(norms: SkipNorms) -> str:
    """Layers as rows, one column of Frobenius norms per method."""
    cols = ["layer", *norms]
    lines = ["| " + " | ".join(cols) + " |"]
    lines.append("|" + "|".join("---:" for _ in cols) + "|")
    for row in table_rows(norms):
        cells = [str(row["layer"])] + ["" if row[m] is None else f"{row[m]:.4f}" for m in norms]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(norms: SkipNorms, path: Path, title: str = "content skip norm by layer") -> None:
    """Grouped bars, layer on x, ||W_skip||_F on y (PNG, matplotlib's Agg backend)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    series = {m: [0.0 if x is None else x for x in v] for m, v in norms.items()}
    depth = max((len(v) for v in series.values()), default=0)
    width = 0.8 / max(1, len(series))
    fig, ax = plt.subplots(figsize=(max(4.0, 0.35 * depth + 2), 3.2), dpi=120)
    for k, (m, v) in enumerate(series.items()):
        ax.bar([i - 0.4 + width * (k + 0.5) for i in range(len(v))], v, width, label=m)
    ax.set_xticks(range(0, depth, max(1, depth // 16)))
    ax.set_xlabel("layer")
    ax.set_ylabel("||W_skip||_F")
    ax.set_title(title)
    if len(series) > 1:
        ax.legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def write_skip_norms(norms: SkipNorms, out_dir: Path, stem: str = "skip_norms") -> list[Path]:
    """``<stem>.csv``, ``<stem>.md`` and ``<stem>.png`` under ``out_dir`` (none if no skip)."""
    norms = {m: v for m, v in norms.items() if any(x is not None for x in v)}
    if not norms:
        return []
    out_dir = Path(out_dir)
    paths = [out_dir / f"{stem}.csv", out_dir / f"{stem}.md", out_dir / f"{stem}.png"]
    atomic_write_bytes(paths[0], to_csv(norms).encode())
    atomic_write_bytes(paths[1], to_markdown(norms).encode())
    plot(norms, paths[2])
    return paths
