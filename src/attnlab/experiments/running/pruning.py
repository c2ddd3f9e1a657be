"""Early stopping of hopeless grid points (``[sweep.prune]``, off by default).

For each pruning step ``s`` (in order): every run still training is trained up to ``s`` (it
stops there with a checkpoint, exactly as if it had been killed and will be resumed), then the
runs of each group ``(variant, seed)`` are compared on their validation loss at ``s``:

    pruned  <=>  val_loss(run, s) > factor x median{ val_loss(r, s) : r in group, r reached s }

(runs that diverged before ``s`` have no loss there and are left out of the median). A pruned run
gets ``status = "pruned"`` in its ``status.json`` with the reason; the others continue. The
whole grid reaches ``s`` before any decision, so the same runs are pruned whatever ``--jobs`` or
the launcher; an unpruned run resumes from its step-``s`` checkpoint and ends bit for bit where
an uninterrupted run would. Cost: one extra model build and checkpoint load per run and step.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from attnlab.experiments.resolve import Experiment, RunPlan
from attnlab.experiments.results import val_curve
from attnlab.experiments.running.execute import RunOutcome, is_over, report_outcome
from attnlab.experiments.running.progress import ExperimentProgress
from attnlab.runs import rundir

if TYPE_CHECKING:
    from attnlab.experiments.running.launch import Launcher


def _step(r: RunPlan) -> int:
    st = rundir.read_status(r.run_dir) or {}
    return int(st.get("step", 0) or 0)


def val_at(r: RunPlan, step: int) -> float | None:
    """The run's validation loss at ``step`` (from ``metrics.jsonl``), or None."""
    return dict(val_curve(r.run_dir)).get(step)


def decide(
    values: dict[tuple[str, int], float],
    groups: dict[tuple[str, int], tuple[str, int]],
    factor: float,
) -> dict[tuple[str, int], tuple[float, float]]:
    """Runs to prune: ``{run: (its loss, its group's median)}`` for losses above
    ``factor x median`` of their group. ``values``: loss per run; ``groups``: run -> group."""
    by_group: dict[tuple[str, int], list[float]] = {}
    for key, v in values.items():
        by_group.setdefault(groups[key], []).append(v)
    medians = {g: statistics.median(vs) for g, vs in by_group.items()}
    return {
        key: (v, medians[groups[key]])
        for key, v in values.items()
        if v > factor * medians[groups[key]]
    }


def run_rungs(
    exp: Experiment,
    runs: list[RunPlan],
    todo: list[RunPlan],
    launch: Launcher,
    progress: ExperimentProgress | None,
    outcomes: dict[tuple[str, int], RunOutcome],
    say: Callable[[str], None] | None = None,
) -> list[RunPlan]:
    """Train ``todo`` through every pruning step, prune, and return the runs left to finish
    (``outcomes`` receives the pruned, diverged and failed ones)."""
    assert exp.sweep is not None
    prune = exp.sweep.prune
    note = say or (progress.note if progress is not None else (lambda m: None))
    groups = {(r.variant, r.seed): (exp.variants[r.variant].base, r.seed) for r in runs}
    for s in prune.at:
        phase = [replace(r, stop_at=s) for r in todo if _step(r) < s and not is_over(r)]
        if phase:
            note(f"pruning step {s}: training {len(phase)} runs up to step {s}")
            for key, out in launch.run(phase, None, progress).items():
                if out.status != "running":  # diverged or failed before the pruning step
                    outcomes[key] = out
        values = {}
        for r in runs:
            v = val_at(r, s)
            if v is not None:
                values[(r.variant, r.seed)] = v
        going = {(r.variant, r.seed) for r in todo if not is_over(r) and _step(r) >= s}
        for key, (loss, median) in sorted(decide(values, groups, prune.factor).items()):
            if key not in going:
                continue
            r = next(x for x in todo if (x.variant, x.seed) == key)
            reason = (
                f"pruned at step {s}: val loss {loss:.4f} > {prune.factor:g} x median "
                f"{median:.4f} of {groups[key][0]} seed{key[1]}'s grid"
            )
            st = rundir.read_status(r.run_dir) or {}
            st.update({"status": "pruned", "reason": reason, "updated": time.time()})
            rundir.write_status(r.run_dir, st)
            out = RunOutcome(r.variant, r.seed, "pruned", True, reason, final_val_loss=loss)
            outcomes[key] = out
            report_outcome(progress, r, out)
        todo = [r for r in todo if (r.variant, r.seed) not in outcomes and not is_over(r)]
        n_pruned = sum(o.status == "pruned" for o in outcomes.values())
        note(f"pruning step {s}: {n_pruned} runs pruned so far, {len(todo)} continue")
    return todo
