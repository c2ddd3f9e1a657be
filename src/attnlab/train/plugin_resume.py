"""Resuming a run whose plugin source changed since its checkpoints were written: refused (one
model would be trained with two different parts), or allowed by ``--allow-plugin-change`` and
then recorded in ``plugins.json``'s history."""

from __future__ import annotations

import warnings
from pathlib import Path

from attnlab.base import advice
from attnlab.base.errors import UserError
from attnlab.runs import checkpoint, rundir


def plugin_change(run_dir: Path, allowed: bool) -> tuple[int | None, str] | None:
    """None when the run's recorded plugins match the loaded ones (or it has no checkpoint);
    else (the newest checkpoint's step, how the change was allowed) when ``allowed``, and a
    :class:`UserError` naming each changed plugin and the fix when not."""
    newest = checkpoint.newest_state(run_dir)
    conflicts = rundir.plugin_conflicts(run_dir) if newest is not None else []
    if not conflicts:
        return None
    step = newest[1].step if newest is not None else None
    if not allowed:
        raise UserError(
            f"{run_dir} was trained to step {step} with other plugin source code; "
            "resuming would train one model with two different parts:\n  "
            + "\n  ".join(conflicts)
            + "\nRestore the plugin's source, or "
            + (
                advice.COMPARE  # compare has no --out of a run and no --allow-plugin-change
                if advice.restart() == advice.COMPARE
                else "train into another --out; to resume with the new source anyway, pass "
                "--allow-plugin-change (plugins.json records it)"
            )
        )
    warnings.warn(
        f"{run_dir}: resuming at step {step} with changed plugin source "
        f"(--allow-plugin-change): " + "; ".join(conflicts),
        stacklevel=2,
    )
    return step, "--allow-plugin-change"
