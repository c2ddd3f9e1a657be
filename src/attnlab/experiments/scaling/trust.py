"""When a fitted scaling curve is not to be trusted, and the sentence that says why.

Each check returns sentences (empty: it passes); a fit with any is reported by its problems,
never by its numbers:

- **too few rungs**: fewer than ``min_rungs`` (4) sizes with a finished run: three parameters
  through three points always fit, and leave no residual to judge them by;
- **a diverged rung**: a run with a non-finite loss (or marked diverged) is a hole in the ladder
  that the curve would silently bridge;
- **no replicates**: one seed per rung leaves no noise to compare the residuals with and no
  bootstrap;
- **curvature**: the rung means' residuals ``rbar_r = ybar_r - log L(x_r)`` regressed on
  ``[1, z, z^2]`` (``z`` centred ``log x``, weights ``k_r / sigma^2``) have a quadratic term
  more than ``curvature_z`` (3) standard errors from 0: the ladder bends away from one power
  law. The standard error ignores that the fit already absorbed part of the residuals, so the
  test is conservative (it flags less often than its nominal rate);
- **a rung off the curve**: ``|rbar_r| / (sigma / sqrt(k_r)) > outlier_z`` (4);
- **alpha at a bound** of ``[0, alpha_max]``: the exponent is not determined by the data;
- **intervals wider than the value**: for ``E``, ``alpha`` and the reducible loss at the
  geometric-mean rung, ``A x_ref^-alpha`` (``A`` itself is not checked: in the units of ``x``
  its interval is a factor ``x^dalpha`` wide, wider than ``A`` for any useful fit).

Cost: O(R S + B) per fit.
"""

from __future__ import annotations

import math

import numpy as np

from attnlab.experiments.scaling.data import LadderData
from attnlab.experiments.scaling.power_law import PowerLaw
from attnlab.experiments.scaling.settings import FitSettings

#: a seed noise below this (in log-loss) is treated as exact data (synthetic, noise-free)
NOISE_FLOOR = 1e-6


def ladder_problems(data: LadderData, settings: FitSettings, var: str = "N") -> list[str]:
    """Problems of the ladder itself, before any fit: too few rungs, diverged runs, no seeds."""
    out = []
    if data.rungs < settings.min_rungs:
        out.append(
            f"only {data.rungs} rung(s) with a finished run; a curve of 3 parameters needs at "
            f"least {settings.min_rungs} sizes to be judged by its residuals (add rungs)"
        )
    if data.diverged:
        runs = ", ".join(f"{var}={x:.3g} seed {s}" for x, s in data.diverged)
        out.append(
            f"diverged run(s) at {runs}: the curve would bridge the hole; rerun them (a lower "
            "learning rate at that size) or drop the rung from the ladder and say why"
        )
    if data.noise() is None:
        out.append(
            "one seed per rung: no seed noise to judge the residuals by and no bootstrap "
            "interval; run at least 2 seeds per rung"
        )
    return out


def residual_problems(
    data: LadderData, curve: PowerLaw, settings: FitSettings, var: str = "N"
) -> list[str]:
    """Curvature of the residuals and rungs off the curve (needs replicates and 4+ rungs)."""
    sigma = data.noise()
    live = data.counts > 0
    if sigma is None or live.sum() < 4:
        return []
    sigma = max(sigma, NOISE_FLOOR)
    x, k = data.x[live], data.counts[live].astype(np.float64)
    rbar = data.rung_means()[live] - np.log(curve(x))
    out = []
    z = np.log(x) - np.log(x).mean()
    X = np.stack([np.ones_like(z), z, z * z], axis=1)
    w = k / sigma**2
    cov = np.linalg.pinv(X.T @ (w[:, None] * X))
    beta = cov @ (X.T @ (w * rbar))
    z_curve = beta[2] / math.sqrt(max(cov[2, 2], 1e-300))
    if abs(z_curve) > settings.curvature_z:
        out.append(
            f"the residuals curve in log {var} (quadratic term {z_curve:+.1f} standard errors): "
            "the ladder bends away from one power law (a change of regime, or hyperparameters "
            "that stop transferring); no single E, A, alpha describes it"
        )
    off = np.abs(rbar) / (sigma / np.sqrt(k))
    worst = int(np.argmax(off))
    if off[worst] > settings.outlier_z:
        out.append(
            f"the rung at {var}={x[worst]:.3g} lies {off[worst]:.1f} seed-noise errors off the "
            "curve (its loss is not the curve's plus noise); check that run before reading the fit"
        )
    return out


def parameter_problems(
    curve: PowerLaw,
    intervals: dict[str, tuple[float, float]] | None,
    reducible: tuple[float, float, float] | None,
    settings: FitSettings,
) -> list[str]:
    """alpha at a bound; intervals of E, alpha and the reducible loss wider than their values."""
    out = []
    edge = 1e-3 * settings.alpha_max
    if curve.alpha <= edge or curve.alpha >= settings.alpha_max - edge:
        out.append(
            f"alpha = {curve.alpha:.4g} sits at its bound (fitted in [0, {settings.alpha_max:g}]): "
            "the data do not determine the exponent"
        )
    if intervals is None:
        return out
    values = {"E": curve.E, "alpha": curve.alpha}
    for name, value in values.items():
        lo, hi = intervals[name]
        if hi - lo > abs(value):
            out.append(
                f"the interval of {name} [{lo:.4g}, {hi:.4g}] is wider than {name} = {value:.4g} "
                "itself; more rungs, more seeds or a wider range of sizes would pin it"
            )
    if reducible is not None:
        mid, lo, hi = reducible
        if hi - lo > abs(mid):
            out.append(
                f"the interval of the reducible loss A x^-alpha at the middle rung "
                f"[{lo:.4g}, {hi:.4g}] is wider than its value {mid:.4g}"
            )
    return out
