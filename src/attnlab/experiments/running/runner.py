"""Run every (variant, seed) of an experiment into ``OUT/runs/<variant>/seed<k>/``.

Each run is one call of :func:`attnlab.train.train`, so a rerun resumes an interrupted run from
its last checkpoint and returns a finished (or diverged) one without training. A diverged run is a
result; an exception in one run is recorded in its ``status.json`` (``failed``, the error, and
the traceback in ``error.txt``) and the experiment goes on with the next run (one run:
:mod:`~attnlab.experiments.running.execute`). Before anything trains, this module refuses run
directories made with other configs and vocabularies too small for the data, prepares each data
directory once and writes ``experiment.json`` (:mod:`~attnlab.experiments.record`).

Where the runs execute is the launcher's business (:mod:`~attnlab.experiments.running.launch`): this
process (``--jobs N`` worker processes) or submitit jobs. A sweep with pruning on runs in phases
(:mod:`~attnlab.experiments.running.pruning`); a run it pruned is over, like a diverged one, while pruning
stays on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from attnlab.base.errors import UserError
from attnlab.config import dump_toml
from attnlab.experiments.record import claim_experiment, write_record
from attnlab.experiments.resolve import Experiment, RunPlan
from attnlab.experiments.running.execute import RunOutcome, is_over, needs_work
from attnlab.experiments.running.launch import Launcher, LocalLauncher
from attnlab.experiments.running.progress import ExperimentProgress
from attnlab.experiments.running.pruning import run_rungs
from attnlab.runs import lock, rundir
from attnlab.train.batches import prepare_if_missing, resolve_data_dir


def check_resumable(runs: list[RunPlan]) -> None:
    """Refuse, before anything trains, to resume run directories made with other configs."""
    problems = []
    for r in runs:
        given = r.config.model_copy(deep=True)
        given.data.dir = str(resolve_data_dir(given))
        diff = rundir.config_conflicts(r.run_dir, dump_toml(given), upgrade=rundir.in_todays_keys)
        if diff:
            problems.append(
                f"{r.run_dir}: " + "; ".join(diff[:4]) + (" ..." if len(diff) > 4 else "")
            )
    if problems:
        raise UserError(
            "these runs were started with a different config, so resuming would mix two "
            "experiments (saved -> now):\n  "
            + "\n  ".join(problems)
            + "\nUse another --out, or delete those run directories to train them again"
        )


def prepare_data(runs: list[RunPlan], say=print) -> None:
    """Tokenise each distinct data config once, before the first run (not inside its timing)."""
    seen: set[Path] = set()
    for r in runs:
        path = resolve_data_dir(r.config)
        if path in seen:
            continue
        seen.add(path)
        t0 = time.perf_counter()
        existed = (path / "meta.json").is_file()
        prepare_if_missing(r.config, path)
        if not existed:
            say(
                f"prepared {r.config.data.corpus} / {r.config.data.tokenizer} into {path} "
                f"in {time.perf_counter() - t0:.1f} s"
            )


def check_vocab(runs: list[RunPlan]) -> None:
    """Refuse, before anything trains, a model whose vocabulary cannot hold its data's tokens
    (the trainer would refuse every such run one by one)."""
    from attnlab.data import read_meta
    from attnlab.train.objectives import extra_ids, resolve_objective

    problems = []
    for r in runs:
        cfg = r.config
        try:
            vocab = int(read_meta(resolve_data_dir(cfg))["vocab_size"])
        except (UserError, OSError, KeyError, ValueError):
            continue  # the trainer reports an unreadable data directory itself
        need = vocab + extra_ids(
            resolve_objective(cfg.model, cfg.train), cfg.data.seq_len, cfg.train.mask_prob
        )
        if need > cfg.model.vocab_size:
            problems.append(
                f"{r.variant}: model.vocab_size={cfg.model.vocab_size} < {need} ids of "
                f"tokenizer {cfg.data.tokenizer!r}"
            )
    if problems:
        raise UserError(
            "the model's vocabulary is too small for the data:\n  "
            + "\n  ".join(dict.fromkeys(problems))
            + "\nset model.vocab_size in [base.model] (a multiple of 64 is fastest)"
        )


def run_all(
    exp: Experiment,
    out_dir: str | Path,
    *,
    only: list[str] | None = None,
    progress: ExperimentProgress | None = None,
    jobs: int = 1,
    launcher: Launcher | None = None,
) -> list[RunOutcome]:
    """Train (and evaluate) every run that is not over yet, through ``launcher`` (default: this
    machine, ``jobs`` at a time); returns one outcome per run, in the experiment's order.
    ``out_dir`` is locked for the call: a second process on it fails at once, naming the holder's
    pid."""
    out = Path(out_dir)
    with lock.locked(out, "experiment directory"):
        return _run_all(exp, out, only, progress, jobs, launcher)


def _run_all(
    exp: Experiment,
    out: Path,
    only: list[str] | None,
    progress: ExperimentProgress | None,
    jobs: int,
    launcher: Launcher | None,
) -> list[RunOutcome]:
    claim_experiment(out)
    runs = exp.runs(out, only)
    check_resumable(runs)
    say = progress.note if progress is not None else (lambda m: None)
    launch = launcher or LocalLauncher(jobs, say)
    launch.check(runs, out)
    write_record(exp, out)
    prepare_data(runs, say)
    check_vocab(runs)
    pruning = exp.sweep is not None and exp.sweep.prune.enabled
    if not pruning:
        unprune(runs, say)
    todo = [r for r in runs if needs_work(r, exp.evaluate)]
    waiting = {(r.variant, r.seed) for r in todo}
    outcomes: dict[tuple[str, int], RunOutcome] = {}
    for r in runs:
        if (r.variant, r.seed) not in waiting:
            st = rundir.read_status(r.run_dir) or {}
            outcomes[(r.variant, r.seed)] = RunOutcome(
                r.variant,
                r.seed,
                st.get("status", "?"),
                False,
                st.get("reason"),
                final_val_loss=st.get("final_val_loss"),
            )
    if progress is not None:
        plan = []
        for r in todo:
            st = rundir.read_status(r.run_dir) or {}
            left = 0 if is_over(r) else exp.steps - int(st.get("step", 0))
            plan.append((r.variant, r.seed, left))
        progress.total = len(runs)
        progress.done = len(runs) - len(todo)
        progress.begin(plan)
        if progress.done:
            progress.note(f"{progress.done} of {len(runs)} runs already done")
    try:
        if pruning:
            todo = run_rungs(exp, runs, todo, launch, progress, outcomes)
        if todo:
            outcomes.update(launch.run(todo, exp.evaluate, progress))
    finally:
        if progress is not None:
            progress.finish()
    return [outcomes[(r.variant, r.seed)] for r in runs]


def unprune(runs: list[RunPlan], say: Callable[[str], None]) -> None:
    """Pruning is off: runs pruned by an earlier invocation resume from their checkpoint."""
    for r in runs:
        st = rundir.read_status(r.run_dir)
        if st is not None and st.get("status") == "pruned":
            st.update(
                {"status": "running", "reason": "resumed: pruning is off", "updated": time.time()}
            )
            rundir.write_status(r.run_dir, st)
            say(f"{r.variant} seed{r.seed} was pruned; pruning is off, so it resumes")
