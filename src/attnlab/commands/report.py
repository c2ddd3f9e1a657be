"""``attnlab report DIR``: rebuild report.md, plots and results.csv/json of an experiment directory
from its finished runs (no training); a ladder directory (``attnlab ladder --out DIR``) gets its
ladder report (fits, gaps, verdicts)."""

from __future__ import annotations

import argparse

from attnlab.base import exitcodes

NAME = "report"
HELP = "rebuild the report, plots and results tables of an `attnlab compare` or `ladder` directory"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", metavar="DIR", help="the directory `attnlab compare` (or `ladder`) wrote")


def run(args: argparse.Namespace) -> int:
    from attnlab.base.safepath import check_tree
    from attnlab.experiments import build_report
    from attnlab.experiments.record import claim_experiment, read_record

    check_tree(args.out)
    from pathlib import Path

    from attnlab.experiments.reports.ladder_report import LADDER_FILE, build_ladder_report

    if (Path(args.out) / LADDER_FILE).is_file():
        print(f"wrote {build_ladder_report(args.out)}")
        return exitcodes.OK
    read_record(args.out)  # an experiment directory, or the error that says what to give
    claim_experiment(args.out)  # its files are recorded, so a report edited later is kept
    path = build_report(args.out)
    print(f"wrote {path}")
    return exitcodes.OK
