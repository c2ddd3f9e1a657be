"""The probe's results table in the shape of seed 000's Table 2: method, trainable params,
perplexity, cloze and multiple-choice accuracy, written as ``results.csv``, ``results.json`` and
``report.md``.

Kept to plain rows of ``{column: value}`` so a generic experiment report can take over: a row is
``{"method", "params", "status", "steps", <task metrics...>}`` and ``columns`` names, in order,
which metric of which task becomes a column (``"perplexity"`` -> ``ppl``, ``"cloze:x"`` ->
``x acc``, ...).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# metric(s) shown per task name (the part before ':'); others: acc if present, else all scalars
PRIMARY = {
    "perplexity": ("perplexity",),
    "wikitext": ("word_perplexity",),
    "cloze": ("acc",),
    "lambada": ("acc",),
    "hellaswag": ("acc", "acc_norm"),
    "arc": ("acc", "acc_norm"),
    "arc_easy": ("acc", "acc_norm"),
    "arc_challenge": ("acc", "acc_norm"),
}
LOWER_IS_BETTER = ("ppl", "perplexity", "loss")


def task_columns(results: Mapping[str, Mapping[str, Any]]) -> dict[str, float | None]:
    """``{column: value}`` from one run's :func:`attnlab.eval.evaluate` results."""
    out: dict[str, float | None] = {}
    for key, entry in results.items():
        metrics = entry.get("metrics", {})
        name = key.split(":", 1)[0]
        wanted = PRIMARY.get(name) or (("acc",) if "acc" in metrics else tuple(metrics))
        for m in wanted:
            if m not in metrics:
                continue
            label = "ppl" if (key, m) == ("perplexity", "perplexity") else f"{key} {m}"
            out[label] = metrics[m]
    return out


def make_row(
    method: str,
    params: int,
    status: str,
    steps: int,
    results: Mapping[str, Mapping[str, Any]],
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "method": method,
        "params": params,
        **task_columns(results),
        "status": status,
        "steps": steps,
        **(extra or {}),
    }


def columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    seen: list[str] = []
    for r in rows:
        seen.extend(k for k in r if k not in seen)
    return seen


def _fmt(col: str, v: Any) -> str:
    if v is None:
        return ""
    if col == "params":
        return f"{v / 1e6:.2f}M" if v >= 10_000 else f"{v:,}"
    if isinstance(v, float):
        return f"{v:.2f}" if any(k in col for k in LOWER_IS_BETTER) else f"{v:.3f}"
    return str(v)


def _best(rows: Sequence[Mapping[str, Any]], col: str) -> Any:
    vals = [r[col] for r in rows if isinstance(r.get(col), int | float) and r.get("params")]
    if not vals or col in ("params", "steps"):
        return None
    return min(vals) if any(k in col for k in LOWER_IS_BETTER) else max(vals)


def to_markdown(rows: Sequence[Mapping[str, Any]], title: str, notes: Sequence[str] = ()) -> str:
    """A markdown table; the best value of each metric among trained methods in bold."""
    cols = columns(rows)
    lines = [f"# {title}", "", "| " + " | ".join(cols) + " |"]
    lines.append("|" + "|".join(":--" if c == "method" else "--:" for c in cols) + "|")
    for r in rows:
        cells = []
        for c in cols:
            text = _fmt(c, r.get(c))
            best = _best(rows, c)
            cells.append(f"**{text}**" if text and best is not None and r.get(c) == best else text)
        lines.append("| " + " | ".join(cells) + " |")
    if notes:
        lines += ["", *[f"- {n}" for n in notes]]
    return "\n".join(lines) + "\n"


def to_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns(rows), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if v is None else v) for k, v in r.items()})
    return buf.getvalue()


def write_report(
    out_dir: Path,
    rows: Sequence[Mapping[str, Any]],
    title: str,
    notes: Sequence[str] = (),
    appendix: str = "",
) -> list[Path]:
    """``results.csv``, ``results.json`` (rows + notes) and ``report.md`` in ``out_dir``."""
    from attnlab.base.owned import write_owned

    out_dir = Path(out_dir)
    payload = {"title": title, "rows": list(rows), "notes": list(notes)}
    md = to_markdown(rows, title, notes) + (f"\n{appendix}" if appendix else "")
    return [  # a file the user edited since attnlab wrote it is kept aside first
        write_owned(out_dir, "results.csv", to_csv(rows).encode()),
        write_owned(out_dir, "results.json", (json.dumps(payload, indent=2) + "\n").encode()),
        write_owned(out_dir, "report.md", md.encode()),
    ]
