"""``attnlab ladder EXPERIMENT --out DIR``: every variant of an experiment at a ladder of model
sizes, each rung a compare experiment on a compute-proportional budget, the learning rate tuned
where the parametrisation needs it, and scaling fits with a verdict per variant.

    plan      :func:`plan_ladder`: rungs resolved (shape, budget, matched controls), µP's
              overrides, the tuning sweeps, where everything lives under OUT
    cost      the plan's printout, its FLOPs and estimated time, the memory check of the top rung
    tuning    the best learning rate per variant from a rung's tuning sweep
    run       :func:`ladder`: all of ``attnlab ladder``, from the file to the report

The report is :mod:`attnlab.experiments.reports.ladder_report`; the fits
:mod:`attnlab.experiments.scaling`.
"""

from attnlab.experiments.ladder.plan import LadderPlan, plan_ladder
from attnlab.experiments.ladder.run import LadderRequest, LadderResult, ladder

__all__ = ["LadderPlan", "LadderRequest", "LadderResult", "ladder", "plan_ladder"]
