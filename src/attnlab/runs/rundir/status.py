"""``status.json``: the run's state, replaced atomically (a reader never sees half of it)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attnlab.base.atomic import atomic_write_json
from attnlab.runs.records import RunFileError, Status, read_json_file
from attnlab.runs.rundir.files import STATUS_FILE, warn_run_file


def read_status(run_dir: str | Path, *, strict: bool = False) -> dict[str, Any] | None:
    """The run's ``status.json`` as a dict, or None when there is none.

    A damaged file (not JSON, wrong shape) raises :class:`RunFileError` with ``strict``; otherwise
    it is reported as a :class:`RunFileWarning` and read as None (the caller then treats the run
    as unstarted, and ``attnlab train`` rewrites the file from the checkpoints).
    """
    path = Path(run_dir) / STATUS_FILE
    if not path.is_file():
        return None
    try:
        return read_json_file(Status, path).model_dump(exclude_unset=True)
    except RunFileError as e:
        if strict:
            raise
        warn_run_file(f"{e}; ignoring it (rerunning the same command rewrites it)")
        return None


def write_status(run_dir: str | Path, status: Mapping[str, Any]) -> None:
    """Validate and atomically replace ``status.json``."""
    Status.model_validate(dict(status))
    atomic_write_json(Path(run_dir) / STATUS_FILE, dict(status), indent=1)
