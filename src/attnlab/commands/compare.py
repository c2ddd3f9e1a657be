"""``attnlab compare EXPERIMENT --out DIR``: train every (variant, seed) of an experiment file on
identical batches, then write results.csv/json, report.md and plots. Rerunning resumes.

An experiment with a ``[sweep]`` table runs every (variant, grid point, seed); ``--plan`` shows
the grid, its run count and an estimated time; ``--max-runs`` (or ``sweep.max_runs``) refuses a
grid that is too large. ``--launcher slurm`` submits the runs as submitit jobs."""

from __future__ import annotations

import argparse
import sys

from attnlab.base import exitcodes
from attnlab.base.advice import COMPARE
from attnlab.base.errors import UserError
from attnlab.commands._common import (
    add_launcher_arguments,
    add_set_argument,
    add_skip_argument,
    check_launcher_args,
)

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
    add_launcher_arguments(
        p,
        "train N runs at once in separate processes (CPU: cores split between them; several "
        "GPUs: one each; one GPU: one after another). Results are the same as with --jobs 1. "
        "With --launcher slurm: at most N jobs at once",
    )
    p.add_argument(
        "--max-runs",
        type=int,
        default=None,
        metavar="N",
        help="refuse an experiment (a sweep's grid) with more than N runs",
    )
    p.add_argument("--quiet", action="store_true", help="no progress display")


def run(args: argparse.Namespace) -> int:
    from attnlab.experiments.compare import CompareRequest, compare
    from attnlab.experiments.running.progress import fmt_duration

    check_launcher_args(args)
    if args.max_runs is not None and args.max_runs < 1:
        raise UserError("--max-runs must be at least 1")
    request = CompareRequest(
        experiment=args.experiment,
        out=args.out,
        overrides=args.overrides,
        plugins=args.plugins,
        only=[n.strip() for item in args.only for n in item.split(",") if n.strip()],
        plan=args.plan,
        jobs=args.jobs,
        max_runs=args.max_runs,
        launcher=args.launcher,
        launcher_args=args.launcher_args,
        quiet=args.quiet,
        skip_check=args.skip_check,
    )
    result = compare(request, lambda line: print(line, file=sys.stderr, flush=True))
    if args.plan:
        return exitcodes.OK
    outcomes = result.outcomes
    trained = sum(o.trained for o in outcomes)
    by: dict[str, int] = {}
    for o in outcomes:
        by[o.status] = by.get(o.status, 0) + 1
    summary = ", ".join(f"{n} {k}" for k, n in sorted(by.items()))
    print(
        f"{len(outcomes)} runs ({summary}); trained {trained}, skipped {len(outcomes) - trained} "
        f"already done; {fmt_duration(result.wall)} wall. Report: {result.report}",
        flush=True,
    )
    for o in result.failed:
        print(f"failed: {o.variant} seed{o.seed}: {o.reason}", file=sys.stderr)
    return exitcodes.FAILED if result.failed else exitcodes.OK
