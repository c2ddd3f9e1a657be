"""Whose directory it is: a run directory is claimed before anything is written to it, and
``--restart`` deletes only what training wrote there."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterable
from pathlib import Path

from attnlab.base.errors import UserError
from attnlab.base.owned import claim, keep_if_edited, shown
from attnlab.runs import checkpoint as ck
from attnlab.runs.checkpoint import newest_state
from attnlab.runs.rundir.configs import known_configs
from attnlab.runs.rundir.files import CONFIG_FILE, METRICS_FILE, RUN_KIND, STATUS_FILE


def _trained_here(run_dir: Path) -> bool:
    """An unmarked directory an earlier attnlab trained: it has an intact checkpoint."""
    return newest_state(run_dir) is not None


def claim_run(run_dir: str | Path, what: str = "run directory") -> None:
    """Mark ``run_dir`` as attnlab's run directory, or refuse a directory that holds anything
    attnlab did not write there (naming it; see :func:`attnlab.base.owned.claim`)."""
    claim(run_dir, RUN_KIND, what=what, legacy=_trained_here)


def checkpoint_strangers(run_dir: str | Path) -> list[str]:
    """Paths under ``RUN/checkpoints`` that no checkpoint writer made (a user's file)."""

    root = Path(run_dir) / ck.CHECKPOINTS
    if root.is_symlink():
        return [str(root)]
    if not root.is_dir():
        return [] if not root.exists() else [str(root)]
    files = {ck.MODEL_FILE, ck.OPTIM_FILE, ck.STATE_FILE}
    out: list[str] = []
    for p in sorted(root.iterdir()):
        if p.name in (ck.LATEST, f"{ck.LATEST}.tmp") and p.is_file() and not p.is_symlink():
            continue
        if re.fullmatch(r"step_\d+(\.tmp)?", p.name) and p.is_dir() and not p.is_symlink():
            out += [str(q) for q in sorted(p.iterdir()) if q.name not in files or not q.is_file()]
            continue
        out.append(str(p))
    return out


def check_clearable(run_dir: str | Path) -> None:
    """Refuse ``--restart`` when ``checkpoints/`` holds anything a checkpoint writer did not
    make (it would be deleted with them), naming it."""
    strangers = checkpoint_strangers(run_dir)
    if strangers:
        raise UserError(
            f"--restart would delete {Path(run_dir) / ck.CHECKPOINTS}, which holds files attnlab "
            f"did not write: {shown(strangers)}. Move them out of the run directory and rerun"
        )


def clear_run(run_dir: str | Path, files: Iterable[str] = ()) -> None:
    """Delete what training wrote into ``run_dir`` (``--restart``): its checkpoints, metrics,
    status, config and ``files``. Refuses, deleting nothing, when ``checkpoints/`` holds anything
    a checkpoint writer did not make; a config file that is not the one attnlab wrote (edited)
    is kept aside (``config.user-edited-TIME.toml``) with a warning."""
    run_dir = Path(run_dir)
    check_clearable(run_dir)
    keep_if_edited(run_dir, CONFIG_FILE, known_configs(run_dir))  # a user's edits: kept
    shutil.rmtree(run_dir / ck.CHECKPOINTS, ignore_errors=True)
    for name in (METRICS_FILE, STATUS_FILE, CONFIG_FILE, *files):
        (run_dir / name).unlink(missing_ok=True)
