"""How many runs an experiment expands to, and the limits on it (``--max-runs``,
``sweep.max_runs``)."""

from __future__ import annotations

from attnlab.base.errors import UserError
from attnlab.experiments.resolve import Experiment


def n_runs(exp: Experiment) -> int:
    return len(exp.variants) * len(exp.seeds)


def check_budget(exp: Experiment, max_runs: int | None = None) -> None:
    """Refuse an experiment with more runs than ``--max-runs`` or ``sweep.max_runs`` allow."""
    limits = []
    if max_runs is not None:
        limits.append((max_runs, f"--max-runs {max_runs}"))
    if exp.sweep is not None and exp.sweep.max_runs is not None:
        limits.append((exp.sweep.max_runs, f"sweep.max_runs = {exp.sweep.max_runs}"))
    if not limits:
        return
    limit, what = min(limits)
    n = n_runs(exp)
    if n > limit:
        raise UserError(
            f"the experiment expands to {n} runs ({describe_count(exp)}), more than {what} "
            "allows; use fewer grid values, variants or seeds, or raise the limit"
        )


def describe_count(exp: Experiment) -> str:
    """``3 variants x 12 grid points x 2 seeds``."""
    seeds = f"{len(exp.seeds)} seed{'s' if len(exp.seeds) != 1 else ''}"
    if exp.sweep is None:
        return f"{len(exp.variants)} variants x {seeds}"
    n_var = len({v.base for v in exp.variants.values()})
    n_pts = len(exp.variants) // max(n_var, 1)
    return f"{n_var} variants x {n_pts} grid points x {seeds}"
