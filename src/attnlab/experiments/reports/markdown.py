"""The Markdown of the reports: tables, number formats, and writing ``report.md`` whole."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

REPORT = "report.md"
#: the reports' figures, under the experiment directory
PLOTS = "plots"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str = "") -> str:
    """A Markdown table; ``align`` one ``l`` or ``r`` per column (default: first left, rest
    right). A ``|`` inside a cell is escaped."""
    align = align or "l" + "r" * (len(headers) - 1)
    sep = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(sep) + " |"]
    for r in rows:
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |")
    return "\n".join(lines)


def fmt(x: float | None, digits: int = 4) -> str:
    """``x`` with ``digits`` decimals; an em dash for None or NaN."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:.{digits}f}"


def pm(mean: float, std: float, digits: int | None = 4) -> str:
    """``mean ± std``; ``digits=None`` picks them from the magnitude (4 below 100, 2 below 1e4,
    else none)."""
    if math.isnan(mean):
        return "—"
    if digits is None:
        digits = 4 if abs(mean) < 100 else 2 if abs(mean) < 1e4 else 0
    if math.isnan(std):
        return f"{mean:,.{digits}f}"
    return f"{mean:,.{digits}f} ± {std:,.{digits}f}"


def signed_pct(x: float | None, digits: int = 2) -> str:
    if x is None or math.isnan(x):
        return "—"
    return f"{x:+.{digits}f}%"


def count_statuses(statuses: Iterable[str]) -> dict[str, int]:
    """How many runs have each status, in order of first appearance."""
    counts: dict[str, int] = {}
    for s in statuses:
        counts[s] = counts.get(s, 0) + 1
    return counts


def status_counts(counts: dict[str, int]) -> str:
    """``3 finished, 1 diverged``: the usual statuses first, in a fixed order."""
    order = ("finished", "diverged", "failed", "running", "missing")
    parts = [f"{counts[k]} {k}" for k in order if counts.get(k)]
    parts += [f"{n} {k}" for k, n in counts.items() if k not in order]
    return ", ".join(parts)


def image(alt: str, path: Path, out: Path) -> list[str]:
    """A figure line (its path relative to the report) and a blank line."""
    return [f"![{alt}]({path.relative_to(out).as_posix()})", ""]


def write_report(out: Path, lines: list[str]) -> Path:
    """``out/report.md``, replaced whole (atomically); a report the user edited since attnlab
    wrote it is kept aside first (``report.user-edited-TIME.md``, with a warning)."""
    from attnlab.base.owned import write_owned

    return write_owned(out, REPORT, "\n".join(lines).encode("utf-8"))
