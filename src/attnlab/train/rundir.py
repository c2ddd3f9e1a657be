"""The run directory's small files: ``config.toml``, ``status.json`` and ``metrics.jsonl``.

``status.json`` is replaced atomically (write + fsync + rename), so a reader never sees half of it.
``metrics.jsonl`` is append-only while training; on resume it is cut back to the checkpoint's step,
so the rows of an interrupted-and-resumed run are the rows of an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attnlab.config import Config
from attnlab.errors import UserError

CONFIG_FILE = "config.toml"
STATUS_FILE = "status.json"
METRICS_FILE = "metrics.jsonl"
# Config sections that do not change what is trained: a rerun may differ in them.
_UNCHECKED_SECTIONS = ("eval", "experiment")


def _json_safe(value: Any) -> Any:
    """NaN/inf as strings, so files stay strict JSON (readable by any parser)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Mapping):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def write_json_atomic(path: Path, obj: Any) -> None:
    """Replace ``path`` with ``obj`` as JSON so readers see the old or the new file, never a mix."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(_json_safe(obj), f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_status(run_dir: Path) -> dict[str, Any] | None:
    """The run's ``status.json``, or None when there is none (or it is unreadable)."""
    try:
        return json.loads((Path(run_dir) / STATUS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_status(run_dir: Path, status: Mapping[str, Any]) -> None:
    write_json_atomic(Path(run_dir) / STATUS_FILE, dict(status))


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def config_diff(old: Config, new: Config) -> list[str]:
    """``key: old -> new`` for every trained-relevant dotted key that differs."""
    a, b = _flatten(old.to_dict()), _flatten(new.to_dict())
    lines = []
    for key in sorted(set(a) | set(b)):
        if key.split(".", 1)[0] in _UNCHECKED_SECTIONS:
            continue
        if a.get(key) != b.get(key):
            lines.append(f"{key}: {a.get(key)!r} -> {b.get(key)!r}")
    return lines


def check_same_config(run_dir: Path, saved: Config, given: Config) -> None:
    """Refuse to resume ``run_dir`` with a config that trains something else."""
    diff = config_diff(saved, given)
    if diff:
        raise UserError(
            f"{run_dir} was started with a different config; resuming would mix two runs. "
            "Differences (saved -> given):\n  "
            + "\n  ".join(diff)
            + "\nUse another --out, or --restart to delete this run's progress and start over"
        )


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """Every complete row of ``metrics.jsonl`` (a torn last line from a kill is skipped)."""
    path = Path(run_dir) / METRICS_FILE
    rows = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    return rows


class MetricsLog:
    """Append-only ``metrics.jsonl``; opening it drops rows after ``keep_through_step``."""

    def __init__(self, run_dir: Path, keep_through_step: int) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        kept = [r for r in read_metrics(run_dir) if int(r.get("step", 0)) <= keep_through_step]
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for row in kept:
                f.write(json.dumps(row) + "\n")
        os.replace(tmp, self.path)
        self._f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())

    def append(self, row: Mapping[str, Any]) -> None:
        self._f.write(json.dumps(_json_safe(dict(row))) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()
