"""Scaling laws over a ladder of model sizes: fits with honest uncertainty, the gap between two
variants as a function of size, and the sizes of the rungs.

    data        a variant's final losses per rung and seed (:class:`RungLosses`), in log space
    power_law   L(x) = E + A x^-alpha and its fit (Huber on log L, batched Levenberg-Marquardt)
    resample    the bootstrap's replicates: seeds within rungs (default) or rungs and seeds
    trust       when a fit is not to be trusted, and the sentence that says why
    fit         :func:`fit_scaling`: one variant's curve with intervals for E, A, alpha, L(x)
    gap         :func:`compare_scaling`: the gap's trend (slope in log10 x) and extrapolation
    sizes       :class:`SizeRule`: rung i's shape, token budget and compute; each rung resolved
                as an experiment, so matched controls are matched at every size
    settings    :class:`FitSettings`: the fit's loss, the bootstrap and the checks' thresholds

Fits, gaps and rules are plain data and numpy; the figures are drawn by
:mod:`attnlab.experiments.reports.scaling_plots`.
"""

from attnlab.experiments.scaling.data import LadderData, RungLosses, ladder_data
from attnlab.experiments.scaling.fit import Band, ScalingFit, fit_scaling
from attnlab.experiments.scaling.gap import GapFit, GapPoint, compare_scaling
from attnlab.experiments.scaling.power_law import PowerLaw
from attnlab.experiments.scaling.settings import FitSettings
from attnlab.experiments.scaling.sizes import (
    Rung,
    RungShape,
    SizeRule,
    paper_sizes,
    rung_experiment,
    shape,
)

__all__ = [
    "Band",
    "FitSettings",
    "GapFit",
    "GapPoint",
    "LadderData",
    "PowerLaw",
    "Rung",
    "RungLosses",
    "RungShape",
    "ScalingFit",
    "SizeRule",
    "compare_scaling",
    "fit_scaling",
    "ladder_data",
    "paper_sizes",
    "rung_experiment",
    "shape",
]
