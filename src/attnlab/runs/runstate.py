"""What a run directory can offer a reader (``eval``, ``generate``) before its weights load.

A run that diverged before its first checkpoint has no weights at all; "train longer" is the
wrong advice for it, so the reader is told what happened and what to change instead.
"""

from __future__ import annotations

from pathlib import Path

from attnlab.base.errors import NonFiniteError


def require_weights(run_dir: str | Path) -> None:
    """Raise :class:`NonFiniteError` when ``run_dir`` diverged before writing any checkpoint;
    any other state is left to the checkpoint loader to report."""
    from attnlab.runs.checkpoint import complete_checkpoints
    from attnlab.runs.rundir import read_status

    run_dir = Path(run_dir)
    if complete_checkpoints(run_dir):
        return
    status = read_status(run_dir)
    if isinstance(status, dict) and status.get("status") == "diverged":
        raise NonFiniteError(
            f"{run_dir} diverged at step {status.get('step', '?')} ({status.get('reason', '?')}) "
            "before its first checkpoint, so it has no weights to load. Retrain it with a lower "
            "train.lr or a longer train.warmup_steps (attnlab train ... --restart)"
        )
