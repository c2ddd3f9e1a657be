"""Run every (variant, seed) of an experiment into ``OUT/runs/<variant>/seed<k>/``.

Each run is one call of :func:`attnlab.train.train`, so a rerun resumes an interrupted run from
its last checkpoint and returns a finished (or diverged) one without training. A diverged run is a
result; an exception in one run is recorded in its ``status.json`` (``failed``, the error, and
the traceback in ``error.txt``) and the experiment goes on with the next run.

Where the runs execute is the launcher's business (:mod:`~attnlab.experiments.launch`): this
process (``--jobs N`` worker processes) or submitit jobs. A sweep with pruning on runs in phases
(:mod:`~attnlab.experiments.pruning`); a run it pruned is over, like a diverged one, while pruning
stays on.
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnlab.config import dump_toml
from attnlab.errors import UserError
from attnlab.experiments.progress import ExperimentProgress
from attnlab.experiments.resolve import Experiment, RunPlan
from attnlab.experiments.spec import EvaluateSpec
from attnlab.runs import lock, rundir
from attnlab.runs.atomic import atomic_write_json
from attnlab.runs.lock import DirectoryLockedError
from attnlab.train.batches import prepare_if_missing, resolve_data_dir

if TYPE_CHECKING:
    from attnlab.experiments.launch import Launcher

EXPERIMENT_FILE = "experiment.json"


@dataclass
class RunOutcome:
    """What happened to one run in this invocation."""

    variant: str
    seed: int
    status: str  # finished | diverged | pruned | failed | running (stopped early)
    trained: bool  # False when the run was already over and was skipped
    reason: str | None = None
    wall_time: float = 0.0
    final_val_loss: float | None = None
    overhead: float | None = None  # seconds outside the trainer's step loop (setup, evaluation)

    @property
    def detail(self) -> str:
        if self.reason:
            return self.reason
        if not self.trained:
            return "already done"
        return f"val {self.final_val_loss:.4f}" if self.final_val_loss is not None else ""


def write_record(exp: Experiment, out_dir: Path) -> None:
    """Store the resolved experiment in ``OUT/experiment.json`` (atomically)."""
    from attnlab.parts.plugins import manifest

    out_dir.mkdir(parents=True, exist_ok=True)
    specs = sorted({p for v in exp.variants.values() for p in v.config.plugins})
    record = exp.to_record() | {"plugins": manifest(specs)}  # the parts' sources, hashed
    atomic_write_json(out_dir / EXPERIMENT_FILE, record)


def read_record(out_dir: str | Path) -> dict[str, Any]:
    path = Path(out_dir) / EXPERIMENT_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(
            f"{out_dir} has no {EXPERIMENT_FILE}; give the --out directory of `attnlab compare`"
        ) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not valid JSON ({e}); rerun `attnlab compare`") from None
    ok = (
        isinstance(record, dict)
        and isinstance(record.get("baseline"), str)
        and isinstance(record.get("variants"), list)
        and all(isinstance(v, dict) and "name" in v and "config" in v for v in record["variants"])
    )
    if not ok:
        raise UserError(
            f"{path} is valid JSON but not an experiment record (it needs 'baseline' and a "
            "'variants' list with each variant's 'name' and 'config'); rerun `attnlab compare` "
            "with the experiment file to rewrite it"
        )
    from attnlab.parts.plugins import remember

    plugins = record.get("plugins")
    remember(plugins if isinstance(plugins, list) else [])  # a moved plugin's recorded sha256
    return record


def check_resumable(runs: list[RunPlan]) -> None:
    """Refuse, before anything trains, to resume run directories made with other configs."""
    problems = []
    for r in runs:
        given = r.config.model_copy(deep=True)
        given.data.dir = str(resolve_data_dir(given))
        diff = rundir.config_conflicts(r.run_dir, dump_toml(given))
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


def _record_failure(run_dir: Path, error: BaseException, tb: str) -> str:
    reason = f"{type(error).__name__}: {error}"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "error.txt").write_text(tb, encoding="utf-8")
    status = rundir.read_status(run_dir) or {}
    status.update({"status": "failed", "reason": reason, "updated": time.time()})
    rundir.write_status(run_dir, status)
    return reason


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
    from attnlab.experiments.launch import LocalLauncher

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
            from attnlab.experiments.pruning import run_rungs

            todo = run_rungs(exp, runs, todo, launch, progress, outcomes)
        if todo:
            outcomes.update(launch.run(todo, exp.evaluate, progress))
    finally:
        if progress is not None:
            progress.finish()
    return [outcomes[(r.variant, r.seed)] for r in runs]


#: statuses after which a run is not trained again (pruned: while pruning is on)
OVER = ("finished", "diverged", "pruned")


def is_over(r: RunPlan) -> bool:
    """The run finished, diverged or was pruned before (nothing left to train)."""
    st = rundir.read_status(r.run_dir) or {}
    return st.get("status") in OVER and (r.run_dir / rundir.CONFIG_FILE).is_file()


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


def report_outcome(progress: ExperimentProgress | None, r: RunPlan, out: RunOutcome) -> None:
    """Tell the display a run ended, or paused at its pruning step (``stop_at``)."""
    if progress is None:
        return
    if r.stop_at is not None and out.status == "running":
        progress.pause_run(r.variant, r.seed, r.config.train.max_steps - r.stop_at)
    else:
        progress.end_run(r.variant, r.seed, out.status, out.detail, overhead=out.overhead)


def needs_work(r: RunPlan, evaluate: EvaluateSpec | None) -> bool:
    """Training left, or (for a finished run) ``[evaluate]`` tasks without results."""
    if not is_over(r):
        return True
    st = rundir.read_status(r.run_dir) or {}
    return evaluate is not None and st.get("status") == "finished" and bool(_eval_todo(r, evaluate))


def _eval_todo(r: RunPlan, spec: EvaluateSpec) -> list[str]:
    from attnlab.eval.registry import task_key
    from attnlab.eval.results import load_results, results_path

    try:
        done = set(load_results(results_path(r.run_dir))["tasks"])
    except UserError:
        done = set()
    return [t for t in spec.tasks if task_key(t) not in done]


def evaluate_run(r: RunPlan, spec: EvaluateSpec, note: Callable[[str], None]) -> None:
    """Run the ``[evaluate]`` tasks a finished run has no results for yet (``eval/results.json``).

    A failing evaluation is written to ``eval/error.txt`` and does not stop the experiment.
    """
    import torch

    from attnlab.eval import evaluate

    todo = _eval_todo(r, spec)
    if not todo:
        return
    note(f"  evaluating {r.variant} seed{r.seed}: {', '.join(todo)}")
    threads = torch.get_num_threads()
    try:
        if r.config.train.threads:
            torch.set_num_threads(r.config.train.threads)
        evaluate(
            r.run_dir,
            todo,
            spec.limit,
            batch_size=spec.batch_size,
            device=r.config.train.device,
        )
    except KeyboardInterrupt:
        raise
    except Exception as e:
        (r.run_dir / "eval").mkdir(parents=True, exist_ok=True)
        (r.run_dir / "eval" / "error.txt").write_text(traceback.format_exc(), encoding="utf-8")
        note(f"  evaluation of {r.variant} seed{r.seed} failed: {e}")
    finally:
        torch.set_num_threads(threads)


def execute(
    r: RunPlan,
    evaluate: EvaluateSpec | None,
    progress: Callable[[Any], None] | None,
    note: Callable[[str], None],
) -> RunOutcome:
    """Train one run (resuming it) and evaluate it; an exception becomes a ``failed`` outcome."""
    from attnlab.train import train

    t0 = time.perf_counter()
    if is_over(r):
        st = rundir.read_status(r.run_dir) or {}
        out = RunOutcome(
            r.variant,
            r.seed,
            st["status"],
            False,
            st.get("reason"),
            final_val_loss=st.get("final_val_loss"),
        )
        train_time = 0.0
    else:
        try:
            result = train(
                r.config, r.run_dir, progress=progress, resume=True, _stop_after=r.stop_at
            )
        except KeyboardInterrupt:
            raise
        except DirectoryLockedError as e:  # another process owns that run: write nothing in it
            return RunOutcome(r.variant, r.seed, "failed", False, str(e), time.perf_counter() - t0)
        except Exception as e:
            reason = _record_failure(r.run_dir, e, traceback.format_exc())
            return RunOutcome(r.variant, r.seed, "failed", True, reason, time.perf_counter() - t0)
        out = RunOutcome(
            r.variant,
            r.seed,
            result.status,
            not result.already_done,
            result.reason,
            final_val_loss=result.final_val_loss,
        )
        train_time = None if result.resumed_from else float(result.wall_time)
    if evaluate is not None and out.status == "finished":
        evaluate_run(r, evaluate, note)
    out.wall_time = time.perf_counter() - t0
    if train_time is not None and out.trained:
        out.overhead = out.wall_time - train_time
    return out


def _run_here(
    r: RunPlan, evaluate: EvaluateSpec | None, progress: ExperimentProgress | None
) -> RunOutcome:
    """One run in this process."""
    if progress is None:
        return execute(r, evaluate, None, lambda m: None)
    progress.start_run(r.variant, r.seed, r.config.train.max_steps)
    out = execute(r, evaluate, progress, progress.note)
    report_outcome(progress, r, out)
    return out
