"""``attnlab compare`` from start to end, for the command and for code: load the experiment,
prove its plugin parts, print (and with ``plan`` only print) the plan and its time estimate,
claim and lock the directory, train every run that is not over, and write the report.

The top of the experiments package (it imports ``load``, ``running`` and ``reports``); the
command (:mod:`attnlab.commands.compare`) parses flags into a :class:`CompareRequest` and prints
the :class:`CompareResult`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnlab.base.safepath import check_out_dir
from attnlab.experiments.load import load_experiment
from attnlab.experiments.record import claim_experiment
from attnlab.experiments.reports.build import build_report
from attnlab.experiments.resolve import Experiment, RunPlan
from attnlab.experiments.running.estimate import estimate
from attnlab.experiments.running.execute import RunOutcome, is_over
from attnlab.experiments.running.launch import effective_jobs
from attnlab.experiments.running.progress import ExperimentProgress
from attnlab.experiments.running.runner import run_all
from attnlab.experiments.sweeps.budget import check_budget
from attnlab.experiments.sweeps.plan import print_plan
from attnlab.runs import lock
from attnlab.runs.preflight import check_concurrent
from attnlab.runs.trackers import RunInfo, log_report
from attnlab.testing.gate import model_parts, record, require_checked

Say = Callable[[str], None]


@dataclass
class CompareRequest:
    """What ``attnlab compare`` was asked: the file, its ``--set`` and ``--plugin``, and how
    to run (``--only``, ``--plan``, ``--jobs``, ``--max-runs``, ``--launcher``, ...)."""

    experiment: str | Path
    out: str | Path
    overrides: list[str] = field(default_factory=list)
    plugins: list[str] = field(default_factory=list)
    only: list[str] = field(default_factory=list)
    plan: bool = False
    jobs: int = 1
    max_runs: int | None = None
    launcher: str = "local"
    launcher_args: list[str] = field(default_factory=list)
    quiet: bool = False
    skip_check: bool = False


@dataclass
class CompareResult:
    """How it went: one outcome per run (none for ``--plan``), the wall time, the report."""

    outcomes: list[RunOutcome]
    wall: float = 0.0
    report: Path | None = None

    @property
    def failed(self) -> list[RunOutcome]:
        return [o for o in self.outcomes if o.status == "failed"]


def compare(req: CompareRequest, say: Say) -> CompareResult:
    """Plan ``req``'s experiment (printing it through ``say``) and, unless ``req.plan``, run
    it and build its report."""
    exp = load_experiment(req.experiment, req.overrides, req.plugins)
    check_out_dir(req.out)
    configs = [v.config for v in exp.variants.values()]
    checked = (
        {}  # --plan trains nothing: nothing to prove yet
        if req.plan
        else require_checked(model_parts(c.model for c in configs), skip=req.skip_check)
    )
    check_concurrent(configs, min(req.jobs, len(exp.variants) * len(exp.seeds)), "attnlab compare")
    print_plan(exp, say)
    runs = exp.runs(req.out, req.only or None)
    if req.plan:
        jobs = effective_jobs(req.jobs, runs)[0] if req.launcher == "local" else req.jobs
        est = estimate(exp, runs, jobs, skip_over=is_over)
        done = len(runs) - est.runs
        say(est.describe() + (f"; {done} runs already over in {req.out}" if done else ""))
    check_budget(exp, req.max_runs)
    if req.plan:
        return CompareResult([])
    claim_experiment(req.out)  # before anything is written: never a folder of the user's
    return _run(req, exp, runs, checked, say)


def _run(
    req: CompareRequest, exp: Experiment, runs: list[RunPlan], checked: dict[str, Any], say: Say
) -> CompareResult:
    progress = None
    if not req.quiet:
        flops = {v.name: float(v.params.flops_per_token) for v in exp.variants.values()}
        progress = ExperimentProgress(
            len(runs), flops, jobs=req.jobs, log_every=max(1, exp.steps // 10)
        )
    t0 = time.perf_counter()
    with lock.locked(req.out, "experiment directory"):
        record(req.out, checked)
        outcomes = run_all(
            exp,
            req.out,
            only=req.only or None,
            progress=progress,
            jobs=req.jobs,
            launcher=_launcher(req, say),
        )
        wall = time.perf_counter() - t0
        report = build_report(req.out)
        _log_report_plots(runs, Path(req.out))
    return CompareResult(outcomes, wall, report)


def _launcher(req: CompareRequest, say: Say) -> Any:
    """None (this machine) or the submitit launcher ``req.launcher`` names."""
    if req.launcher == "local":
        return None
    from attnlab.experiments.running.launch_submitit import (  # submitit: an optional extra
        SubmititLauncher,
        parse_launcher_args,
    )

    return SubmititLauncher(
        req.launcher,
        Path(req.out) / "submitit",
        parse_launcher_args(req.launcher_args),
        jobs=req.jobs,
        say=say,
    )


def _log_report_plots(runs: list[RunPlan], out: Path) -> None:
    """The report's plots to the runs' trackers, as one run of the experiment's group
    (job type ``report``; TensorBoard: ``OUT/tensorboard``)."""
    if not runs:
        return
    cfg = runs[0].config
    images = {f"report/{p.stem}": p for p in sorted((out / "plots").glob("*.png"))}
    info = RunInfo(run_dir=out, name="report", group=cfg.experiment.name, job_type="report")
    log_report(out, cfg.train.loggers, images, info)
