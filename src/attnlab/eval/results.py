"""Storing and showing evaluation results.

``RUN_DIR/eval/results.json`` holds ``{"tasks": {KEY: ENTRY}}``; a new evaluation of a task
replaces that task's entry and leaves the others, so results accumulate over calls. An entry is
``{"metrics": {...}, "source": ..., "limit": ..., "model": ..., "timestamp": ISO-8601, ...}``.

A results file the user names (``attnlab eval --out FILE``) has the same shape plus attnlab's
stamp (:mod:`attnlab.base.outfile`): results are merged only into a file attnlab wrote and nobody
edited since (:func:`claim_out`, :func:`merge_out`); any other file is left as it is.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attnlab.base.atomic import atomic_write_json
from attnlab.base.errors import UserError
from attnlab.runs.trackers import TRACKERS_FILE, log_results


def results_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / "eval" / "results.json"


def load_results(path: str | Path) -> dict[str, Any]:
    """The stored results (``{"tasks": {}}`` when the file does not exist yet)."""
    p = Path(path)
    if not p.exists():
        return {"tasks": {}}
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{p} is not valid JSON ({e}); move it away to start afresh") from None
    if not isinstance(data, dict) or not isinstance(data.get("tasks"), dict):
        raise UserError(f"{p} is not an attnlab results file (no 'tasks' table)")
    return data


def merge_results(path: str | Path, entries: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Replace the entries of ``entries``' tasks in the file at ``path``; written atomically.
    A run directory trained with trackers (``trackers.json``) logs them there as well."""
    p = Path(path)
    data = load_results(p)
    data["tasks"].update({k: dict(v) for k, v in entries.items()})
    atomic_write_json(p, data)  # NaN/inf become null (the engine's one JSON policy)
    run_dir = p.parent.parent
    if p.parent.name == "eval" and (run_dir / TRACKERS_FILE).is_file():
        log_results(run_dir, entries)  # the run's TensorBoard / wandb get them too
    return data


def claim_out(path: str | Path) -> Path:
    """Check that ``eval --out`` may merge into ``path``: a new file, or an earlier results file
    of attnlab's, unedited (never a user's file, a link, a device, a run's own files)."""
    from attnlab.base.outfile import claim_out_file

    return claim_out_file(path, merge=True, what="results file", force_flag=None)


def merge_out(path: str | Path, entries: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Merge ``entries`` into the results file ``path`` that ``eval --out`` names (claimed
    again first: :func:`claim_out`), written stamped and atomically."""
    from attnlab.base.outfile import read_json_out, stamped_json, write_out_text

    p = claim_out(path)
    data: Any = {"tasks": {}}
    if p.exists():
        try:
            data = read_json_out(p)
        except (OSError, ValueError) as e:
            raise UserError(f"{p} cannot be read as a results file ({e})") from None
        if not isinstance(data, dict) or not isinstance(data.get("tasks"), dict):
            raise UserError(f"{p} is not an attnlab results file (no 'tasks' table)")
    data["tasks"].update({k: dict(v) for k, v in entries.items()})
    write_out_text(p, stamped_json(data), merge=True, what="results file", force_flag=None)
    return data


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        if not math.isfinite(v):
            return ""
        return f"{v:.4f}" if abs(v) < 1e4 else f"{v:.4g}"
    return str(v)


def render_table(results: Mapping[str, Mapping[str, Any]], title: str | None = None) -> Any:
    """A ``rich`` table: one row per (task, metric), the metric's stderr beside it ("n/a" where
    it has none: a task of one item)."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(title) if title else title)  # task names and paths as text
    for col, just in (("task", "left"), ("metric", "left"), ("value", "right")):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    table.add_column("± stderr", justify="right")
    table.add_column("n", justify="right")
    for key, entry in results.items():
        metrics = entry.get("metrics", {})
        n = metrics.get("n", metrics.get("documents", ""))
        first = True
        for name, value in metrics.items():
            if name.endswith("_stderr") or name in ("n", "documents"):
                continue
            se = f"{name}_stderr"
            table.add_row(
                escape(key) if first else "",
                escape(name),
                _fmt(value),
                "n/a" if se in metrics and metrics[se] is None else _fmt(metrics.get(se)),
                _fmt(n) if first else "",
            )
            first = False
    return table


def print_table(results: Mapping[str, Mapping[str, Any]], title: str | None = None) -> None:
    from rich.console import Console

    Console().print(render_table(results, title))
