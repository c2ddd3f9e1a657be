"""``metrics.jsonl``: append-only while training, cut back to the checkpoint's step on resume
(so an interrupted-and-resumed run's rows are an uninterrupted one's); a damaged line is reported
with its file and line and skipped."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attnlab.base.atomic import atomic_write_text, dumps_json
from attnlab.runs.records import MetricsRow, RunFileError, parse_json_text
from attnlab.runs.rundir.files import METRICS_FILE, warn_run_file


def _metric_lines(path: Path) -> tuple[list[tuple[int, dict[str, Any]]], list[tuple[int, str]]]:
    """(line number, row) of every valid line and (line number, problem) of every damaged one.

    A last line without a newline is a write cut short by a kill: dropped without complaint.
    """
    rows: list[tuple[int, dict[str, Any]]] = []
    bad: list[tuple[int, str]] = []
    data = path.read_bytes()
    lines = data.split(b"\n")
    torn = lines.pop() if lines else b""  # after the final newline: empty, or a torn write
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
            rows.append((number, _row(text)))
        except UnicodeDecodeError:
            bad.append((number, "not UTF-8 text (binary garbage?)"))
        except RunFileError as e:
            bad.append((number, str(e).strip()))
    if torn.strip():
        try:
            text = torn.decode("utf-8")
        except UnicodeDecodeError:
            bad.append((len(lines) + 1, "not UTF-8 text (binary garbage?)"))
        else:
            with contextlib.suppress(RunFileError):
                rows.append((len(lines) + 1, _row(text)))
    return rows, bad


def _row(text: str) -> dict[str, Any]:
    """A validated row with the keys it was written with (so ``"val_loss" in row`` works)."""
    return parse_json_text(MetricsRow, text, "the line").model_dump(exclude_unset=True)


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every valid row of ``metrics.jsonl``. Damaged lines are skipped with a
    :class:`RunFileWarning` naming the file and line."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    rows, bad = _metric_lines(path)
    for number, problem in bad:
        warn_run_file(
            f"{path} line {number} is not a metrics row ({problem}); skipped. Rerunning "
            "`attnlab train` on the run drops it, or delete the line"
        )
    return [r for _, r in rows]


class MetricsLog:
    """Append-only ``metrics.jsonl``; opening it keeps the rows through ``keep_through_step``
    (rewritten atomically) and drops damaged lines with a warning."""

    def __init__(self, run_dir: str | Path, keep_through_step: int) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        kept: list[dict[str, Any]] = []
        if self.path.is_file():
            rows, bad = _metric_lines(self.path)
            kept = [r for _, r in rows if r["step"] <= keep_through_step]
            last_kept = max((n for n, r in rows if r["step"] <= keep_through_step), default=0)
            for number, problem in bad:
                where = "after" if number > last_kept else "before"
                warn_run_file(
                    f"{self.path} line {number} is not a metrics row ({problem}); dropped "
                    f"({where} the checkpoint at step {keep_through_step}"
                    + (", so training recomputes it)" if where == "after" else ")")
                )
        atomic_write_text(self.path, "".join(dumps_json(r) + "\n" for r in kept))
        self._f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())

    def append(self, row: Mapping[str, Any]) -> None:
        MetricsRow.model_validate(dict(row))
        self._f.write(dumps_json(dict(row)) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()
