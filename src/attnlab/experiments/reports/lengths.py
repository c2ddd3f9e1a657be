"""Perplexity against evaluation length (train short, test long): a table and two figures.

Reads the ``perplexity@L`` entries that ``attnlab eval --lengths`` (or an experiment's
``[evaluate] lengths``) writes into each run's ``eval/results.json``, including those of an
evaluation-time change (``perplexity@L+position.scaling=yarn+...``, an arm of its own named
``variant+change``). Per arm and length: the mean perplexity over seeds with the seeds' spread
(min to max), a line per arm over lengths on log axes, and the loss by token position at the
longest length (mean over windows, then over seeds), which shows where a model breaks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from attnlab.experiments.reports.markdown import table
from attnlab.experiments.reports.plots import palette, save

KEY = re.compile(r"^perplexity(?::[^@]*)?@(\d+)(\+.*)?$")


def length_results(run_dir: str | Path) -> dict[str, dict[int, dict[str, Any]]]:
    """``{tag: {length: entry}}`` of one run ("" = the run as trained)."""
    f = Path(run_dir) / "eval" / "results.json"
    try:
        tasks = json.loads(f.read_text(encoding="utf-8")).get("tasks", {})
    except (OSError, ValueError):
        return {}
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for key, entry in tasks.items():
        m = KEY.match(key)
        if m and isinstance(entry, dict):
            out.setdefault(m.group(2) or "", {})[int(m.group(1))] = entry
    return out


def collect(rows: Sequence[Any]) -> dict[str, dict[int, list[dict[str, Any]]]]:
    """``{arm: {length: [entry per seed]}}`` over the finished runs ``rows`` (RunRow)."""
    arms: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for r in rows:
        if not r.run_dir:
            continue
        for tag, by_length in length_results(r.run_dir).items():
            arm = f"{r.variant}{tag}"
            for n, entry in by_length.items():
                arms.setdefault(arm, {}).setdefault(n, []).append(entry)
    return arms


def _ppl(entries: list[dict[str, Any]]) -> list[float]:
    return [float(e["metrics"]["perplexity"]) for e in entries]


def lengths_table(arms: dict[str, dict[int, list[dict[str, Any]]]]) -> str:
    """Mean perplexity [min, max over seeds] per arm (rows) and length (columns)."""
    lengths = sorted({n for a in arms.values() for n in a})
    cells = []
    for arm, by_length in arms.items():
        row = [arm]
        for n in lengths:
            p = _ppl(by_length.get(n, []))
            row.append(f"{np.mean(p):.2f} [{min(p):.2f}, {max(p):.2f}]" if p else "—")
        cells.append(row)
    return table(["arm", *(f"L={n}" for n in lengths)], cells)


def lengths_plot(arms: dict[str, dict[int, list[dict[str, Any]]]], trained: int | None,
                 path: Path) -> Path:  # fmt: skip
    """Perplexity against length per arm: the seeds' mean, and their min-max band."""
    fig = Figure(figsize=(7.5, 4.5))
    ax = fig.add_subplot()
    colours = palette(list(arms))
    for arm, by_length in arms.items():
        xs = sorted(by_length)
        ps = [_ppl(by_length[n]) for n in xs]
        mean = [float(np.mean(p)) for p in ps]
        ax.plot(xs, mean, marker="o", label=arm, color=colours[arm])
        ax.fill_between(xs, [min(p) for p in ps], [max(p) for p in ps], alpha=0.2,
                        color=colours[arm])  # fmt: skip
    if trained:
        ax.axvline(trained, color="grey", linestyle=":", label=f"training length {trained}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel("perplexity (mean over seeds, band: min-max)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3)
    return save(fig, path)


def position_plot(arms: dict[str, dict[int, list[dict[str, Any]]]], trained: int | None,
                  path: Path) -> Path:  # fmt: skip
    """Loss by token position at the longest length (mean over windows and seeds)."""
    fig = Figure(figsize=(7.5, 4.5))
    ax = fig.add_subplot()
    colours = palette(list(arms))
    for arm, by_length in arms.items():
        n = max(by_length)
        curves = [e["loss_by_position"] for e in by_length[n] if e.get("loss_by_position")]
        if not curves:
            continue
        mean = np.mean(np.array(curves, dtype=float), axis=0)
        width = max(1, n // 32)  # a running mean over nearby positions: readable lines
        smooth = np.convolve(mean, np.ones(width) / width, mode="valid")
        ax.plot(np.arange(len(smooth)) + (width + 1) / 2, smooth, label=f"{arm} (L={n})",
                color=colours[arm])  # fmt: skip
    if trained:
        ax.axvline(trained, color="grey", linestyle=":", label=f"training length {trained}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("token position in the window")
    ax.set_ylabel("loss (nats), running mean over L/32 positions")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3)
    return save(fig, path)


def lengths_section(out: Path, rows: Sequence[Any]) -> list[str]:
    """The report's "Perplexity by length" section (nothing when no run has such results)."""
    arms = collect(rows)
    if not arms:
        return []
    trained = next(
        (e.get("trained_length") for a in arms.values() for es in a.values() for e in es), None
    )
    lengths_plot(arms, trained, out / "plots" / "perplexity_by_length.png")
    position_plot(arms, trained, out / "plots" / "loss_by_position.png")
    seeds = {len(es) for a in arms.values() for es in a.values()}
    return [
        "## Perplexity by evaluation length",
        "",
        f"Trained at {trained} tokens; evaluated on non-overlapping windows of each length "
        f"(`attnlab eval --lengths`). Mean perplexity over seeds [min, max] ({min(seeds)}-"
        f"{max(seeds)} seeds per cell):",
        "",
        lengths_table(arms),
        "",
        "![perplexity by length](plots/perplexity_by_length.png)",
        "",
        "![loss by position](plots/loss_by_position.png)",
        "",
    ]


def is_length_column(column: str) -> bool:
    """A ``perplexity@L`` metric column (drawn by this section, not the evaluation table)."""
    return bool(KEY.match(column.split("/")[0]))
