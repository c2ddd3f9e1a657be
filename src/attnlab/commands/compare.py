"""``attnlab compare EXPERIMENT --out DIR``: train every (variant, seed) of an experiment file on
identical batches, then write results.csv/json, report.md and plots. Rerunning resumes.

An experiment with a ``[sweep]`` table runs every (variant, grid point, seed); ``--plan`` shows
the grid, its run count and an estimated time; ``--max-runs`` (or ``sweep.max_runs``) refuses a
grid that is too large. ``--launcher slurm`` submits the runs as submitit jobs."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from attnlab.base import exitcodes
from attnlab.base.advice import COMPARE
from attnlab.base.errors import UserError
from attnlab.commands._common import add_set_argument, add_skip_argument

NAME = "compare"
HELP = "run a multi-variant, multi-seed experiment file and write a report with statistics"
#: how this command's user starts a run over (``attnlab.base.advice``)
RESTART = COMPARE


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_skip_argument(p)
    p.add_argument("experiment", metavar="EXPERIMENT", help="an experiment TOML file")
    p.add_argument("--out", required=True, metavar="DIR", help="the experiment directory")
    add_set_argument(
        p,
        "a base config value (model.*, train.*, ...) or an experiment key (budget.steps, seeds, "
        "baseline, sweep.*)",
        "budget.steps=100",
    )
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="VARIANT",
        help="run only this variant (repeatable, or comma-separated); the report covers all",
    )
    p.add_argument(
        "--plan",
        action="store_true",
        help="print the variants, parameter counts (a sweep: its grid and run count) and a timed "
        "estimate of the wall time, and stop",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help="train N runs at once in separate processes (CPU: cores split between them; "
        "several GPUs: one each; one GPU: one after another). Results are the same as with "
        "--jobs 1. With --launcher slurm: at most N jobs at once",
    )
    p.add_argument(
        "--max-runs",
        type=int,
        default=None,
        metavar="N",
        help="refuse an experiment (a sweep's grid) with more than N runs",
    )
    p.add_argument(
        "--launcher",
        choices=("local", "slurm", "submitit-local"),
        default="local",
        help="where runs execute: this machine (default), Slurm jobs through submitit (needs "
        "submitit: pip install 'submitit>=1.5'), or submitit's local executor (a subprocess "
        "per run, all at once; to try the submitit path without a cluster)",
    )
    p.add_argument(
        "--launcher-arg",
        dest="launcher_args",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a submitit executor parameter (repeatable), e.g. slurm_partition=gpu, "
        "gpus_per_node=1, cpus_per_task=8, timeout_min=240 (the default), mem_gb=32",
    )
    p.add_argument("--quiet", action="store_true", help="no progress display")


def print_plan(exp, say) -> None:
    """One line per variant: non-embedding parameters, change vs the baseline, overrides, match;
    a sweep adds its grid and run count."""
    if exp.sweep is not None:
        from attnlab.experiments.sweeps.plan import print_sweep_plan

        print_sweep_plan(exp, say)
        return
    base_n = exp.variants[exp.baseline].params.non_embedding
    say(
        f"experiment {exp.name}: {len(exp.variants)} variants x {len(exp.seeds)} "
        f"seed{'s' if len(exp.seeds) > 1 else ''} "
        f"({', '.join(map(str, exp.seeds))}); {exp.steps:,} steps x {exp.tokens_per_step:,} "
        "tokens/step per run"
    )
    width = max(len(n) for n in exp.variants) + 2
    for v in exp.variants.values():
        n = v.params.non_embedding
        delta = "baseline" if v.name == exp.baseline else f"{100 * (n - base_n) / base_n:+.2f}%"
        line = (
            f"  {v.name:<{width}}{n:>14,} non-emb. ({delta})  {' '.join(v.overrides) or '(base)'}"
        )
        if v.match:
            m = v.match
            line += (
                f"  [matched to {m.target_variant}: {m.achieved:,} vs {m.target:,}, "
                f"{100 * m.rel_gap:+.3f}%]"
            )
        say(line)
    for n in exp.notes:
        say(f"  note: {n}")


def _log_report_plots(runs: list, out: Path) -> None:
    """The report's plots to the runs' trackers, as one run of the experiment's group
    (job type ``report``; TensorBoard: ``OUT/tensorboard``)."""
    from attnlab.runs.trackers import RunInfo, log_report

    if not runs:
        return
    cfg = runs[0].config
    images = {f"report/{p.stem}": p for p in sorted((out / "plots").glob("*.png"))}
    info = RunInfo(run_dir=out, name="report", group=cfg.experiment.name, job_type="report")
    log_report(out, cfg.train.loggers, images, info)


def run(args: argparse.Namespace) -> int:
    from attnlab.base.safepath import check_out_dir
    from attnlab.experiments import build_report, load_experiment, run_all
    from attnlab.experiments.running.progress import ExperimentProgress, fmt_duration
    from attnlab.experiments.sweeps.budget import check_budget
    from attnlab.runs import lock
    from attnlab.runs.preflight import check_concurrent

    if args.jobs < 1:
        raise UserError("--jobs must be at least 1")
    if args.max_runs is not None and args.max_runs < 1:
        raise UserError("--max-runs must be at least 1")
    if args.launcher_args and args.launcher == "local":
        raise UserError("--launcher-arg sets submitit parameters; add --launcher slurm")
    exp = load_experiment(args.experiment, args.overrides, args.plugins)
    check_out_dir(args.out)
    from attnlab.testing.gate import model_parts, record, require_checked

    configs = [v.config for v in exp.variants.values()]
    checked = (
        {}  # --plan trains nothing: nothing to prove yet
        if args.plan
        else require_checked(model_parts(c.model for c in configs), skip=args.skip_check)
    )
    n_runs = len(exp.variants) * len(exp.seeds)
    check_concurrent(
        [v.config for v in exp.variants.values()], min(args.jobs, n_runs), "attnlab compare"
    )
    only = [n.strip() for item in args.only for n in item.split(",") if n.strip()]
    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    print_plan(exp, say)
    runs = exp.runs(args.out, only or None)
    if args.plan:
        from attnlab.experiments.running.estimate import estimate
        from attnlab.experiments.running.execute import is_over
        from attnlab.experiments.running.launch import effective_jobs

        jobs = effective_jobs(args.jobs, runs)[0] if args.launcher == "local" else args.jobs
        est = estimate(exp, runs, jobs, skip_over=is_over)
        done = len(runs) - est.runs
        say(est.describe() + (f"; {done} runs already over in {args.out}" if done else ""))
    check_budget(exp, args.max_runs)
    if args.plan:
        return exitcodes.OK
    from attnlab.experiments.record import claim_experiment

    claim_experiment(args.out)  # before anything is written: never a folder of the user's
    launcher = None
    if args.launcher != "local":
        from attnlab.experiments.running.launch_submitit import (
            SubmititLauncher,
            parse_launcher_args,
        )

        launcher = SubmititLauncher(
            args.launcher,
            Path(args.out) / "submitit",
            parse_launcher_args(args.launcher_args),
            jobs=args.jobs,
            say=say,
        )
    progress = None
    if not args.quiet:
        flops = {v.name: float(v.params.flops_per_token) for v in exp.variants.values()}
        progress = ExperimentProgress(
            len(runs), flops, jobs=args.jobs, log_every=max(1, exp.steps // 10)
        )
    t0 = time.perf_counter()
    with lock.locked(args.out, "experiment directory"):
        record(args.out, checked)
        outcomes = run_all(
            exp,
            args.out,
            only=only or None,
            progress=progress,
            jobs=args.jobs,
            launcher=launcher,
        )
        wall = time.perf_counter() - t0
        report = build_report(args.out)
        _log_report_plots(runs, Path(args.out))
    trained = sum(o.trained for o in outcomes)
    by = {}
    for o in outcomes:
        by[o.status] = by.get(o.status, 0) + 1
    summary = ", ".join(f"{n} {k}" for k, n in sorted(by.items()))
    print(
        f"{len(outcomes)} runs ({summary}); trained {trained}, skipped {len(outcomes) - trained} "
        f"already done; {fmt_duration(wall)} wall. Report: {report}",
        flush=True,
    )
    failed = [o for o in outcomes if o.status == "failed"]
    for o in failed:
        print(f"failed: {o.variant} seed{o.seed}: {o.reason}", file=sys.stderr)
    return exitcodes.FAILED if failed else exitcodes.OK
