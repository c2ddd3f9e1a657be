"""``attnlab report DIR``: rebuild report.md, plots and results.csv/json of an experiment directory
from its finished runs (no training)."""

from __future__ import annotations

import argparse

from attnlab.base import exitcodes

NAME = "report"
HELP = "rebuild the report, plots and results tables of an `attnlab compare` directory"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", metavar="DIR", help="the directory of `attnlab compare --out DIR`")


def run(args: argparse.Namespace) -> int:
    from attnlab.base.safepath import check_tree
    from attnlab.experiments import build_report
    from attnlab.experiments.record import claim_experiment, read_record

    check_tree(args.out)
    read_record(args.out)  # an experiment directory, or the error that says what to give
    claim_experiment(args.out)  # its files are recorded, so a report edited later is kept
    path = build_report(args.out)
    print(f"wrote {path}")
    return exitcodes.OK
