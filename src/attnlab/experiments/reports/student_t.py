"""The paired t-test's two-sided p-value, without SciPy (so ``compare`` stays in the core install).

For differences ``d`` of ``n`` pairs, ``t = mean(d) / (std(d, ddof=1) / sqrt(n))`` with
``nu = n - 1`` degrees of freedom, and the two-sided p-value is the regularized incomplete beta
function ``p = I_x(nu / 2, 1 / 2)`` at ``x = nu / (nu + t^2)`` (Abramowitz & Stegun 26.7.1 with
26.5.27). ``I_x(a, b)`` is evaluated by its continued fraction (modified Lentz), on whichever side
of ``x = (a + 1) / (a + b + 2)`` converges fast, so small p-values keep their relative precision.
This is what ``scipy.stats.ttest_rel(...).pvalue`` computes; the tests check the two agree.
Cost: O(1) per test (tens of continued-fraction terms).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

_TINY = 1e-300
_EPS = 1e-16
_MAX_TERMS = 10_000


def _continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of ``I_x(a, b)`` (Numerical Recipes' ``betacf``), by modified Lentz."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = 1.0
    d = 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, _MAX_TERMS):
        m2 = 2 * m
        for aa in (
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + aa / c
            c = c if abs(c) > _TINY else _TINY
            delta = d * c
            h *= delta
        if abs(delta - 1.0) < _EPS:
            return h
    return h


def regularized_beta(a: float, b: float, x: float) -> float:
    """``I_x(a, b)``, the regularized incomplete beta function, for ``a, b > 0`` and ``0 <= x <= 1``."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _continued_fraction(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    """``P(|T| >= |t|)`` for Student's t with ``df`` degrees of freedom."""
    if math.isnan(t) or df <= 0:
        return math.nan
    if math.isinf(t):
        return 0.0
    return regularized_beta(df / 2.0, 0.5, df / (df + t * t))


def paired_t_pvalue(variant: Sequence[float], baseline: Sequence[float]) -> float:
    """Two-sided p-value of the paired t-test of ``variant - baseline`` (needs >= 2 pairs and
    differences that are not all equal, else the statistic is undefined: returns NaN)."""
    diffs = [float(v) - float(b) for v, b in zip(variant, baseline, strict=True)]
    n = len(diffs)
    if n < 2:
        return math.nan
    mean = math.fsum(diffs) / n
    var = math.fsum((d - mean) ** 2 for d in diffs) / (n - 1)
    if var == 0.0:
        return math.nan
    return t_two_sided_p(mean / math.sqrt(var / n), n - 1)
