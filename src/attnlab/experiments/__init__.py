"""Fair multi-variant comparisons: ``attnlab compare EXPERIMENT --out DIR``.

An experiment file (:mod:`~attnlab.experiments.spec`) names a base config, variants, seeds and a
budget; :func:`load_experiment` validates every variant's config (and sizes parameter-matched
controls) before anything trains; :func:`run_all` trains each (variant, seed) into
``DIR/runs/<variant>/seed<k>/`` with identical batches per seed; :func:`build_report` turns the
run directories into ``results.csv``, ``results.json``, ``report.md`` and ``plots/``.

The package, by concern, in layers: each imports only the ones above it, and ``running`` and
``reports`` never import each other (tests/repo/test_import_layers.py):

    spec, sweep_spec       the experiment file and its ``[sweep]`` table
    matching, resolve      one validated config per variant (parameter-matched controls)
    record, results        ``experiment.json``; one row per run read back from its directory
    sweeps/                a ``[sweep]`` grid expanded into arms, the run count, the --plan text
    running/               ``run_all``: launchers (local, --jobs, submitit), pruning, progress
    reports/               ``build_report``: the comparison or sweep report, plots, statistics
    load                   ``load_experiment``: the file, ``--set`` and ``--plugin``, resolved
    compare                ``compare``: all of ``attnlab compare``, from the file to the report
"""

from attnlab.experiments.load import load_experiment
from attnlab.experiments.matching import MatchResult, closest_integer
from attnlab.experiments.reports.build import build_report
from attnlab.experiments.reports.stats import mean_std, paired_test, relative_improvement
from attnlab.experiments.resolve import Experiment, RunPlan, Variant, resolve
from attnlab.experiments.running.execute import RunOutcome
from attnlab.experiments.running.runner import run_all
from attnlab.experiments.spec import ExperimentSpec, parse_experiment, read_experiment

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
