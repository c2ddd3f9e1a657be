"""``plugins.json``: the plugins a run trained with (spec, module, file, sha256 of the source),
checked against the sources loaded now."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from attnlab.base.atomic import atomic_write_json
from attnlab.parts.plugin_changes import changed, source_changes
from attnlab.parts.plugins import manifest, remember
from attnlab.runs.rundir.files import warn_run_file

PLUGINS_FILE = "plugins.json"


def write_plugins(
    run_dir: str | Path, specs: list[str], *, replaced_at: int | None = None, how: str = ""
) -> None:
    """Record the run's plugins (spec, module, file, sha256 of the source, distribution) in
    ``plugins.json``; nothing is written for a run without plugins. When the recorded sources
    differ from these (a resume with ``--allow-plugin-change``), the earlier records move to
    ``history`` with the step they trained up to (``replaced_at``) and ``how`` it was allowed."""
    records = manifest(list(specs))
    path = Path(run_dir) / PLUGINS_FILE
    old: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        loaded = json.loads(path.read_text(encoding="utf-8"))
        old = loaded if isinstance(loaded, dict) else {}
    history = [h for h in old.get("history", []) if isinstance(h, dict)]
    before = old.get("plugins")
    hashes = lambda rs: sorted(str(r.get("sha256")) for r in rs if isinstance(r, dict))  # noqa: E731
    if isinstance(before, list) and before and hashes(before) != hashes(records):
        history.append({"plugins": before, "until_step": replaced_at, "allowed_by": how or None})
    if records or history:
        body: dict[str, Any] = {"plugins": records}
        if history:
            body["history"] = history
        atomic_write_json(path, body)


def plugin_conflicts(run_dir: str | Path) -> list[str]:
    """``SPEC: sha256 RECORDED (trained) -> NOW (loaded)`` for every plugin whose source changed
    since ``run_dir`` recorded it in ``plugins.json`` (with the helper modules that changed);
    empty when the sources are the same."""
    return [
        f"{spec}: sha256 {then} (trained) -> {now} (now)" + (f"; {what}" if what else "")
        for spec, then, now, what in source_changes(recorded_plugins(run_dir))
    ]


def recorded_plugins(run_dir: str | Path) -> list[dict[str, Any]]:
    """The plugins ``plugins.json`` records (``[]`` without the file; a damaged file is a
    :class:`RunFileWarning`, once per process), made known to the plugin loader first
    (:func:`attnlab.parts.plugins.remember`), so a plugin file that moved is reported with the
    SHA-256 the run recorded. Call it before validating the run's config."""
    path = Path(run_dir) / PLUGINS_FILE
    try:
        stat = path.stat()
    except OSError:
        return []
    if not path.is_file():  # a directory or a FIFO someone put there: not a record
        return []
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    if key not in _plugin_records:
        try:
            records = json.loads(path.read_text(encoding="utf-8")).get("plugins", [])
            if not isinstance(records, list):
                raise ValueError("'plugins' is not a list")
        except (OSError, ValueError, AttributeError):
            warn_run_file(
                f"{path} is damaged; the plugins' sources cannot be checked against the run"
            )
            records = []
        _plugin_records[key] = [r for r in records if isinstance(r, dict)]
    records = _plugin_records[key]
    remember(records)
    return records


_plugin_records: dict[tuple[str, int, int], list[dict[str, Any]]] = {}


def check_plugins(run_dir: str | Path) -> None:
    """Warn when a plugin's source differs from the one the run recorded."""
    for sentence in changed(recorded_plugins(run_dir)):
        warn_run_file(f"{run_dir}: {sentence}")
