"""The sections both reports (comparison and sweep) have: who wrote the report, the fairness check
of the batch schedules, and the notes on runs that did not finish."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import attnlab
from attnlab.experiments.reports.markdown import table
from attnlab.experiments.results import RunRow


def written_by() -> str:
    """The header bullet with the time and the attnlab version that wrote the report."""
    return f"- written {time.strftime('%Y-%m-%d %H:%M:%S')} by attnlab {attnlab.__version__}"


def fairness_section(rows: list[RunRow], seeds: Sequence[int], rule: str) -> list[str]:
    """The report's "Fairness" section: ``rule`` (what must be shared), then per seed the
    schedule hashes its runs read, and a warning when a seed's runs are not paired."""
    text, fair = _fairness(rows, seeds)
    return [
        "## Fairness: one batch schedule per seed",
        "",
        rule,
        "",
        text,
        "",
        "All runs of each seed share one schedule hash."
        if fair
        else "**Warning: some runs of a seed read a different schedule; their comparison is not "
        "paired.**",
        "",
    ]


def _fairness(rows: list[RunRow], seeds: Sequence[int]) -> tuple[str, bool]:
    all_ok, cells = True, []
    for s in seeds:
        ran = [r for r in rows if r.seed == s and r.schedule_hash]
        hashes = sorted({r.schedule_hash for r in ran})
        vhashes = sorted({r.val_schedule_hash for r in ran if r.val_schedule_hash})
        shared = len(hashes) == 1
        all_ok &= shared or not ran
        verdict = (
            "yes" if shared else ("no runs yet" if not ran else f"**NO** ({len(hashes)} hashes)")
        )
        cells.append(
            [
                str(s),
                f"{len(ran)}",
                ", ".join(f"`{h[:16]}`" for h in hashes) or "—",
                verdict,
                ", ".join(f"`{h[:16]}`" for h in vhashes) or "—",
            ]
        )
    heads = ["seed", "runs", "train schedule hash", "one hash for all runs?", "validation schedule"]
    return table(heads, cells, "lrlll"), all_ok


def notes_section(rows: list[RunRow], notes: list[str], statuses: Sequence[str]) -> list[str]:
    """ "## Notes": each run whose status is in ``statuses`` (with its reason; a failed run's
    traceback file), then ``notes``; nothing when there is neither."""
    problems = [r for r in rows if r.status in statuses]
    if not (problems or notes):
        return []
    lines = ["## Notes", ""]
    for r in problems:
        what = r.reason or ""
        if r.status == "failed":
            what += f" (traceback in `{Path(r.run_dir, 'error.txt')}`)"
        lines.append(f"- {r.variant} seed{r.seed}: **{r.status}** {what}".rstrip())
    return [*lines, *(f"- {n}" for n in notes), ""]
