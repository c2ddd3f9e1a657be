"""Experiment trackers: where a run's numbers go besides ``RUN_DIR/metrics.jsonl``.

``train.loggers`` (``probe.train.loggers`` for a probe; a compare run takes its config's) lists
``jsonl`` (the default; ``metrics.jsonl`` is always written), ``tensorboard`` and ``wandb``. The
shared loop (:mod:`attnlab.runs.loop`) opens the run's trackers and feeds them its progress
events: the config at the start, every logged metrics row (``train/*``, ``val/loss``, the parts' ``part/KEY/LAYER``) and the
final status at the end. Evaluation results merged into ``RUN_DIR/eval/results.json`` later
(``attnlab eval``, compare's ``[evaluate]``, the probe's evaluation) are logged to the same runs
(``eval/TASK/METRIC``), found again through ``RUN_DIR/trackers.json``, and ``attnlab compare``
logs its report's plots. The clients are optional (``pip install 'attnlab[trackers]'``).
"""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attnlab.runs.progress import ProgressEvent
from attnlab.runs.trackers.base import INSTALL, RunInfo, Tracker, TrackerError

NAMES = ("jsonl", "tensorboard", "wandb")
TRACKERS_FILE = "trackers.json"
_CLASSES = {
    "tensorboard": ("attnlab.runs.trackers.tb", "TensorBoardTracker"),
    "wandb": ("attnlab.runs.trackers.wandb_run", "WandbTracker"),
}
#: metrics.jsonl column -> tracker scalar name
SCALARS = {
    "loss": "train/loss",
    "lr": "train/lr",
    "grad_norm": "train/grad_norm",
    "tokens": "train/tokens",
    "tokens_per_s": "train/tokens_per_s",
    "mfu": "train/mfu",
    "elapsed": "train/elapsed",
    "val_loss": "val/loss",
}


def scalars(row: Mapping[str, Any]) -> dict[str, float]:
    """A metrics row as tracker scalars (finite numbers only)."""
    out = {}
    for key, value in row.items():
        # the parts' training statistics keep their own names (part/KEY/LAYER)
        name = SCALARS.get(key) or (key if key.startswith("part/") else None)
        if name and isinstance(value, int | float) and math.isfinite(value):
            out[name] = float(value)
    return out


def _read(run_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((run_dir / TRACKERS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write(run_dir: Path, data: dict[str, Any]) -> None:
    from attnlab.base.atomic import atomic_write_json

    atomic_write_json(run_dir / TRACKERS_FILE, data)


def _make(name: str, info: RunInfo, state: dict[str, Any]) -> Tracker:
    module, cls = _CLASSES[name]
    return getattr(importlib.import_module(module), cls)(info, state)


class Trackers:
    """The open trackers of one run (rank 0), called with the loop's progress events."""

    def __init__(self, info: RunInfo, trackers: list[Tracker], record: dict[str, Any]) -> None:
        self.info, self.trackers, self.record = info, trackers, record
        self.closed = False

    @classmethod
    def open(cls, names: Sequence[str], info: RunInfo, config_text: str = "") -> Trackers:
        """Start every tracker of ``names`` besides ``jsonl`` (a missing client is a
        :class:`TrackerError` naming ``pip install 'attnlab[trackers]'``)."""
        unknown = [n for n in names if n not in NAMES]
        if unknown:
            raise TrackerError(f"unknown logger(s) {unknown}; choose from {', '.join(NAMES)}")
        run_dir = Path(info.run_dir)
        old = _read(run_dir)
        states = old.get("state", {}) if isinstance(old.get("state"), dict) else {}
        wanted = [n for n in dict.fromkeys(names) if n != "jsonl"]
        trackers = []
        try:
            for name in wanted:
                trackers.append(_make(name, info, states.setdefault(name, {})))
        except BaseException:
            for t in trackers:
                t.finish(None)
            raise
        record = {
            "loggers": ["jsonl", *wanted],
            "info": {"name": info.name, "group": info.group, "job_type": info.job_type},
            "state": states,
        }
        if wanted:
            _write(run_dir, record)
        out = cls(info, trackers, record)
        if config_text:
            for t in trackers:
                t.log_text("config", config_text)
        return out

    def __call__(self, ev: ProgressEvent) -> None:
        if ev.metrics:
            values = scalars(ev.metrics)
            if values:
                for t in self.trackers:
                    t.log(ev.step, values)
        if ev.kind == "end":
            self.close(ev.status)

    def close(self, status: dict[str, Any] | None) -> None:
        if self.closed:
            return
        self.closed = True
        for t in self.trackers:
            t.finish(status)


def _reopen(directory: Path) -> Trackers | None:
    data = _read(directory)
    names = [n for n in data.get("loggers", []) if n in _CLASSES]
    if not names:
        return None
    meta = data.get("info", {})
    info = RunInfo(
        run_dir=directory,
        name=meta.get("name", directory.name),
        group=meta.get("group", ""),
        job_type=meta.get("job_type", "train"),
    )
    return Trackers.open(names, info)


def log_results(directory: str | Path, entries: Mapping[str, Mapping[str, Any]]) -> None:
    """Log evaluation results (``{task: {"metrics": {...}}}``) to the trackers a run directory
    was trained with, at the run's last step; nothing when it used only ``jsonl``."""
    directory = Path(directory)
    trackers = _reopen(directory)
    if trackers is None:
        return
    from attnlab.runs.rundir import read_status

    step = int((read_status(directory) or {}).get("step") or 0)
    values = {}
    for task, entry in entries.items():
        metrics = entry.get("metrics", {}) if isinstance(entry, Mapping) else {}
        for name, value in metrics.items():
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if number and math.isfinite(value):
                values[f"eval/{task}/{name}"] = float(value)
    for t in trackers.trackers:
        if values:
            t.log(step, values)
    _write(directory, trackers.record)
    trackers.close(None)


def log_report(
    out_dir: str | Path, names: Sequence[str], images: Mapping[str, Path], info: RunInfo
) -> None:
    """Log a report's plots (e.g. compare's ``plots/*.png``) as one run of its own:
    ``info.run_dir`` holds its tracker files (TensorBoard folder, wandb run)."""
    wanted = [n for n in names if n in _CLASSES]
    if not wanted or not images:
        return
    trackers = Trackers.open(wanted, info)
    for t in trackers.trackers:
        t.log_images(0, dict(images))
    trackers.close(None)


__all__ = [
    "INSTALL",
    "NAMES",
    "RunInfo",
    "Tracker",
    "TrackerError",
    "Trackers",
    "check_clients",
    "log_report",
    "log_results",
    "scalars",
]


def check_clients(names: Sequence[str]) -> None:
    """Fail now, naming every missing client and the install command, if a listed tracker's
    client is missing (before anything of the run is written)."""
    from importlib.util import find_spec

    from attnlab.runs.trackers.base import missing_clients

    wanted = [(n, m) for n, m in (("tensorboard", "tensorboard"), ("wandb", "wandb")) if n in names]
    missing = [(n, m) for n, m in wanted if find_spec(m) is None]
    if missing:
        raise missing_clients(missing)
