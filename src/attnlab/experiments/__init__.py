"""Fair multi-variant comparisons: ``attnlab compare EXPERIMENT --out DIR``.

An experiment file (:mod:`~attnlab.experiments.spec`) names a base config, variants, seeds and a
budget; :func:`load_experiment` validates every variant's config (and sizes parameter-matched
controls) before anything trains; :func:`run_all` trains each (variant, seed) into
``DIR/runs/<variant>/seed<k>/`` with identical batches per seed; :func:`build_report` turns the
run directories into ``results.csv``, ``results.json``, ``report.md`` and ``plots/``.

A ``[sweep]`` table (:mod:`~attnlab.experiments.sweep_spec`) expands the experiment into
variant x grid point x seed runs (:mod:`~attnlab.experiments.sweep`), optionally pruned
(:mod:`~attnlab.experiments.pruning`), executed here or as submitit jobs
(:mod:`~attnlab.experiments.launch`), and reported over the grid
(:mod:`~attnlab.experiments.sweep_report`).
"""

from attnlab.experiments.matching import MatchResult, closest_integer
from attnlab.experiments.report import build_report
from attnlab.experiments.resolve import Experiment, RunPlan, Variant, load_experiment, resolve
from attnlab.experiments.runner import RunOutcome, run_all
from attnlab.experiments.spec import ExperimentSpec, parse_experiment, read_experiment
from attnlab.experiments.stats import mean_std, paired_test, relative_improvement

__all__ = [
    "Experiment",
    "ExperimentSpec",
    "MatchResult",
    "RunOutcome",
    "RunPlan",
    "Variant",
    "build_report",
    "closest_integer",
    "load_experiment",
    "mean_std",
    "paired_test",
    "parse_experiment",
    "read_experiment",
    "relative_improvement",
    "resolve",
    "run_all",
]
