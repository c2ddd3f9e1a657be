"""One row per run, read back from the run directories (so ``attnlab report`` needs no training):
``status.json`` for the outcome, ``metrics.jsonl`` for curves, ``eval/results.json`` (when
``attnlab eval`` has run) for extra columns. Written as ``results.csv`` and ``results.json``.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from attnlab.base.atomic import dumps_json
from attnlab.experiments.resolve import run_dir
from attnlab.runs import rundir

COLUMNS = (
    "variant",
    "seed",
    "status",
    "params_total",
    "params_non_embedding",
    "final_val_loss",
    "best_val_loss",
    "perplexity",
    "steps",
    "tokens",
    "wall_time_s",
    "tokens_per_s",
    "device",
    "deterministic",
    "schedule_hash",
    "val_schedule_hash",
    "reason",
    "run_dir",
)


@dataclass
class RunRow:
    """The numbers of one (variant, seed) run."""

    variant: str
    seed: int
    status: str  # finished | diverged | failed | running | missing
    params_total: int
    params_non_embedding: int
    final_val_loss: float | None = None
    best_val_loss: float | None = None
    perplexity: float | None = None
    steps: int = 0
    tokens: int = 0
    wall_time_s: float | None = None
    tokens_per_s: float | None = None
    device: str = ""
    deterministic: bool | None = None  # train.deterministic as the run recorded it
    schedule_hash: str = ""
    val_schedule_hash: str = ""
    reason: str | None = None
    run_dir: str = ""
    eval: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Finished with a finite validation loss: counts in means and tests."""
        return (
            self.status == "finished"
            and self.final_val_loss is not None
            and math.isfinite(self.final_val_loss)
        )

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("eval")
        out.update({f"eval/{k}": v for k, v in sorted(self.eval.items())})
        return out


def _float(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v


def flatten_eval(results: Any, prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a nested dict as ``a/b`` columns (strings, lists, booleans left out)."""
    out: dict[str, float] = {}
    if isinstance(results, dict):
        for k, v in results.items():
            key = f"{prefix}{k}"
            if isinstance(v, bool):
                continue
            if isinstance(v, int | float):
                out[key] = float(v)
            elif isinstance(v, dict):
                out.update(flatten_eval(v, key + "/"))
    return out


def read_eval(path: Path) -> dict[str, float]:
    """``task/metric`` columns from ``eval/results.json`` (``{"tasks": {KEY: {"metrics": ...}}}``,
    the format of :mod:`attnlab.eval.results`): the floating-point metrics of every task; counts
    (tokens, documents, bytes) are left out. Another layout is flattened as it is."""
    f = path / "eval" / "results.json"
    if not f.is_file():
        return {}
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
    except ValueError:
        return {}
    tasks = data.get("tasks") if isinstance(data, dict) else None
    if not isinstance(tasks, dict):
        return flatten_eval(data)
    out: dict[str, float] = {}
    for key, entry in tasks.items():
        metrics = entry.get("metrics") if isinstance(entry, dict) else None
        if isinstance(metrics, dict):
            out.update({f"{key}/{m}": float(v) for m, v in metrics.items() if isinstance(v, float)})
    return out


def collect(out_dir: str | Path, record: dict[str, Any]) -> list[RunRow]:
    """Rows for every (variant, seed) of the experiment record, in seed-major order per variant."""
    out = Path(out_dir)
    rows = []
    for v in record["variants"]:
        for seed in record["seeds"]:
            path = run_dir(out, v["name"], seed)
            st = rundir.read_status(path)
            row = RunRow(
                variant=v["name"],
                seed=int(seed),
                status="missing" if st is None else str(st.get("status", "unknown")),
                params_total=int(v["params_total"]),
                params_non_embedding=int(v["params_non_embedding"]),
                run_dir=str(path),
            )
            if st is not None:
                row.final_val_loss = _float(st.get("final_val_loss"))
                row.best_val_loss = _float(st.get("best_val_loss"))
                if row.final_val_loss is not None and math.isfinite(row.final_val_loss):
                    row.perplexity = math.exp(min(row.final_val_loss, 700.0))
                row.steps = int(st.get("step", 0) or 0)
                row.tokens = int(st.get("tokens", 0) or 0)
                row.wall_time_s = _float(st.get("elapsed"))
                row.tokens_per_s = _float(st.get("tokens_per_s"))
                row.device = str(st.get("device") or "")
                row.deterministic = st.get("deterministic")
                row.schedule_hash = str(st.get("schedule_hash") or "")
                row.val_schedule_hash = str(st.get("val_schedule_hash") or "")
                row.reason = st.get("reason")
                if row.status == "running":
                    row.reason = row.reason or f"stopped at step {row.steps}; rerun to resume"
            row.eval = read_eval(path)
            rows.append(row)
    return rows


def val_curve(path: str | Path) -> list[tuple[int, float]]:
    """(step, val_loss) pairs of a run, in step order."""
    pts = []
    for r in rundir.read_metrics(Path(path)):
        v = _float(r.get("val_loss"))
        if v is not None and "step" in r:
            pts.append((int(r["step"]), v))
    return sorted(dict(pts).items())


def write_results(out_dir: str | Path, rows: list[RunRow], record: dict[str, Any]) -> None:
    """``results.csv`` (fixed columns, then ``eval/...``) and ``results.json``."""
    from attnlab.base.owned import write_owned

    out = Path(out_dir)
    eval_cols = sorted({f"eval/{k}" for r in rows for k in r.eval})
    cols = [*COLUMNS, *eval_cols]
    text = io.StringIO(newline="")
    w = csv.DictWriter(text, fieldnames=cols, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if v is None else v) for k, v in r.to_dict().items()})
    write_owned(out, "results.csv", text.getvalue().encode("utf-8"))
    body = {
        "experiment": record["name"],
        "baseline": record["baseline"],
        "steps": record["steps"],
        "tokens_per_step": record["tokens_per_step"],
        "runs": [r.to_dict() for r in rows],
    }
    write_owned(out, "results.json", (dumps_json(body, indent=2) + "\n").encode("utf-8"))
