"""``attnlab ladder EXPERIMENT --out DIR``: every variant of an experiment file with a
``[ladder]`` table at several model sizes (width and depth grown together), each rung trained on
``tokens_per_param x N`` tokens with identical batches per seed across variants, the learning
rate tuned at rung 0 under µP (every rung without it), then power-law fits, the gap's trend per
variant and report.md. Rerunning resumes; ``--plan`` prints the rungs, FLOPs and an estimated
time and stops."""

from __future__ import annotations

import argparse
import sys

from attnlab.base import exitcodes
from attnlab.base.advice import COMPARE
from attnlab.commands._common import (
    add_launcher_arguments,
    add_set_argument,
    add_skip_argument,
    check_launcher_args,
)

NAME = "ladder"
HELP = "run an experiment at a ladder of model sizes and fit scaling curves with a verdict"
#: how this command's user starts a run over (``attnlab.base.advice``)
RESTART = COMPARE


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_skip_argument(p)
    p.add_argument("experiment", metavar="EXPERIMENT", help="an experiment TOML file with [ladder]")
    p.add_argument("--out", required=True, metavar="DIR", help="the ladder directory")
    add_set_argument(
        p,
        "a base config value (model.*, train.*, ...) or an experiment key (ladder.rungs, "
        "ladder.tokens_per_param, ladder.lr, seeds, ...)",
        "ladder.rungs=4",
    )
    p.add_argument(
        "--plan",
        action="store_true",
        help="print the rungs (shapes, budgets, N per variant), the FLOPs and a timed estimate "
        "of the wall time, and stop",
    )
    add_launcher_arguments(p, "train N runs of a rung at once (as attnlab compare --jobs)")
    p.add_argument("--quiet", action="store_true", help="no progress display")


def run(args: argparse.Namespace) -> int:
    from attnlab.experiments.ladder import LadderRequest, ladder
    from attnlab.experiments.running.progress import fmt_duration

    check_launcher_args(args)
    request = LadderRequest(
        experiment=args.experiment,
        out=args.out,
        overrides=args.overrides,
        plugins=args.plugins,
        plan=args.plan,
        jobs=args.jobs,
        launcher=args.launcher,
        launcher_args=args.launcher_args,
        quiet=args.quiet,
        skip_check=args.skip_check,
    )
    result = ladder(request, lambda line: print(line, file=sys.stderr, flush=True))
    if args.plan:
        return exitcodes.OK
    runs = [o for rung in result.outcomes.values() for o in rung]
    trained = sum(o.trained for o in runs)
    print(
        f"{len(result.outcomes)} rungs, {len(runs)} runs; trained {trained}, skipped "
        f"{len(runs) - trained} already done; {fmt_duration(result.wall)} wall. "
        f"Report: {result.report}",
        flush=True,
    )
    for o in result.failed:
        print(f"failed: {o.variant} seed{o.seed}: {o.reason}", file=sys.stderr)
    return exitcodes.FAILED if result.failed else exitcodes.OK
