"""``OUT/report.md`` (with ``OUT/plots/*.png``), ``OUT/results.csv`` and ``OUT/results.json``,
rebuilt from the run directories and ``OUT/experiment.json`` alone, so it can be regenerated at
any time (``attnlab report OUT``) without training: a comparison's report
(:mod:`~attnlab.experiments.reports.report`) or, for a ``[sweep]``, the sweep's
(:mod:`~attnlab.experiments.reports.sweep_report`)."""

from __future__ import annotations

from pathlib import Path

from attnlab.experiments.record import read_record
from attnlab.experiments.reports.report import compare_report
from attnlab.experiments.reports.sweep_report import sweep_report
from attnlab.experiments.results import collect, write_results


def build_report(out_dir: str | Path) -> Path:
    """Write results.csv/json, plots and report.md for the experiment in ``out_dir``; returns
    the report's path."""
    out = Path(out_dir)
    record = read_record(out)
    rows = collect(out, record)
    write_results(out, rows, record)
    if record.get("sweep"):  # a grid: per-variant tables and plots over it instead
        return sweep_report(out, record, rows)
    return compare_report(out, record, rows)
