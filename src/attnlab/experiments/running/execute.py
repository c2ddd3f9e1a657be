"""One run of an experiment, in whatever process executes it: train it (resuming it), evaluate it,
and tell the progress display; an exception becomes a ``failed`` outcome written into the run's
``status.json`` (with the traceback in ``error.txt``), so the experiment goes on.

Every launcher (:mod:`~attnlab.experiments.running.launch`: this process, ``--jobs`` workers,
submitit jobs) calls :func:`execute`, so a run's directory and outcome do not depend on where it
ran. A run is *over* (:func:`is_over`) once it finished, diverged or was pruned.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlab.base.errors import UserError
from attnlab.experiments.resolve import RunPlan
from attnlab.experiments.running.progress import ExperimentProgress
from attnlab.experiments.spec import EvaluateSpec
from attnlab.parts.family import RETRIEVAL_ROUTE
from attnlab.runs import rundir
from attnlab.runs.lock import DirectoryLockedError


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


#: statuses after which a run is not trained again (pruned: while pruning is on)
OVER = ("finished", "diverged", "pruned")


def is_over(r: RunPlan) -> bool:
    """The run finished, diverged or was pruned before (nothing left to train)."""
    st = rundir.read_status(r.run_dir) or {}
    return st.get("status") in OVER and (r.run_dir / rundir.CONFIG_FILE).is_file()


def record_failure(run_dir: Path, error: BaseException, tb: str) -> str:
    """Write a run's failure into its directory (``status.json``, ``error.txt``); its reason."""
    from attnlab.base.failures import describe, os_error_of
    from attnlab.base.owned import mark

    os_error = os_error_of(error)  # a full disk, a file-size limit (EFBIG), ...: with its fix
    reason = describe(os_error) if os_error is not None else f"{type(error).__name__}: {error}"
    if not run_dir.exists() or not any(run_dir.iterdir()):
        mark(run_dir, rundir.RUN_KIND)  # attnlab's own run directory, so a rerun may use it
    (run_dir / "error.txt").write_text(tb, encoding="utf-8")
    status = rundir.read_status(run_dir) or {}
    status.update({"status": "failed", "reason": reason, "updated": time.time()})
    rundir.write_status(run_dir, status)
    return reason


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
    return evaluate is not None and st.get("status") == "finished" and bool(eval_todo(r, evaluate))


def eval_todo(r: RunPlan, spec: EvaluateSpec) -> list[str]:
    from attnlab.eval.registry import task_key
    from attnlab.eval.results import load_results, results_path

    try:
        done = set(load_results(results_path(r.run_dir))["tasks"])
    except UserError:
        done = set()
    lengths = spec.lengths or r.config.eval.lengths
    return [t for t in spec.tasks if not set(_keys(task_key(t), lengths)) <= done]


def _keys(key: str, lengths: list[int] | None) -> list[str]:
    """The result keys of one task: ``perplexity@L`` per length for a perplexity task."""
    if lengths and key.split(":")[0] == "perplexity":
        return [f"{key}@{n}" for n in lengths]
    return [key]


def evaluate_run(r: RunPlan, spec: EvaluateSpec, note: Callable[[str], None]) -> None:
    """Run the ``[evaluate]`` tasks a finished run has no results for yet (``eval/results.json``).

    A failing evaluation is written to ``eval/error.txt`` and does not stop the experiment.
    """
    import torch

    from attnlab.eval import evaluate

    todo = eval_todo(r, spec)
    if not todo:
        return
    note(f"  evaluating {r.variant} seed{r.seed}: {', '.join(todo)}")
    threads = torch.get_num_threads()
    try:
        if r.config.train.threads:
            torch.set_num_threads(r.config.train.threads)
        if RETRIEVAL_ROUTE in todo:  # a retrieval run is no causal LM target: the run itself
            _retrieval(r, spec)
            todo = [t for t in todo if t != RETRIEVAL_ROUTE]
        if todo:
            evaluate(
                r.run_dir,
                todo,
                spec.limit,
                batch_size=spec.batch_size,
                device=r.config.train.device,
                lengths=spec.lengths or r.config.eval.lengths,
            )
    except KeyboardInterrupt:
        raise
    except Exception as e:
        (r.run_dir / "eval").mkdir(parents=True, exist_ok=True)
        (r.run_dir / "eval" / "error.txt").write_text(traceback.format_exc(), encoding="utf-8")
        note(f"  evaluation of {r.variant} seed{r.seed} failed: {e}")
    finally:
        torch.set_num_threads(threads)


def _retrieval(r: RunPlan, spec: EvaluateSpec) -> None:
    """The ``retrieval`` task (real, mismatched and no neighbours) into ``eval/results.json``."""
    from attnlab.eval.results import merge_results, results_path
    from attnlab.eval.retrieval import retrieval_metrics

    metrics, controls = retrieval_metrics(
        r.run_dir, max_windows=spec.limit, device=r.config.train.device
    )
    entry = {"metrics": metrics, "controls": controls}
    merge_results(results_path(r.run_dir), {"retrieval": entry})


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
            reason = record_failure(r.run_dir, e, traceback.format_exc())
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


def run_here(
    r: RunPlan, evaluate: EvaluateSpec | None, progress: ExperimentProgress | None
) -> RunOutcome:
    """One run in this process."""
    if progress is None:
        return execute(r, evaluate, None, lambda m: None)
    progress.start_run(r.variant, r.seed, r.config.train.max_steps)
    out = execute(r, evaluate, progress, progress.note)
    report_outcome(progress, r, out)
    return out
