"""Statistics of a comparison over seeds.

- mean and sample standard deviation (``ddof = 1``; undefined for one seed);
- relative improvement over the baseline, seed 001's convention: ``100 (b - v) / b`` percent,
  positive = the variant has the lower (better) loss;
- paired tests on per-seed final losses (seed ``k`` of the variant against seed ``k`` of the
  baseline, which read the same batches): the paired t-test (two-sided, assumes normal
  differences; computed as ``scipy.stats.ttest_rel`` does, by :mod:`attnlab.experiments.reports.student_t`,
  so the core install needs no SciPy) is the one reported, and the exact sign-flip permutation
  test (no distribution assumed) is shown beside it. With ``n`` seeds the sign-flip test cannot go
  below ``2 / 2^n`` (0.5 for 2 seeds, 0.0625 for 5), so it needs 6+ seeds to reach 0.05.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from attnlab.experiments.reports.student_t import paired_t_pvalue

#: sign-flip test: exact up to this many pairs, Monte Carlo (fixed seed) beyond
EXACT_FLIPS_MAX_N = 16
MONTE_CARLO_SAMPLES = 20_000


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """(mean, sample std with ddof=1); std is NaN for fewer than 2 values, both NaN for none."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return math.nan, math.nan
    std = float(x.std(ddof=1)) if x.size > 1 else math.nan
    return float(x.mean()), std


def relative_improvement(baseline: float, value: float) -> float:
    """``100 * (baseline - value) / baseline``: percent lower loss than the baseline."""
    if baseline == 0 or not (math.isfinite(baseline) and math.isfinite(value)):
        return math.nan
    return 100.0 * (baseline - value) / baseline


@dataclass(frozen=True)
class PairedTest:
    """A paired comparison of per-seed values ``variant - baseline``."""

    n: int
    mean_diff: float
    p_ttest: float | None
    p_sign_flip: float | None
    note: str = ""

    def describe_t(self) -> str:
        return _fmt_p(self.p_ttest, self.note)

    def describe_sign_flip(self) -> str:
        return _fmt_p(self.p_sign_flip, self.note)


def _fmt_p(p: float | None, note: str) -> str:
    if p is None:
        return f"n/a ({note})" if note else "n/a"
    return f"{p:.3g}" if p >= 1e-4 else f"{p:.1e}"


def sign_flip_pvalue(diffs: Sequence[float], seed: int = 0) -> float:
    """Two-sided exact permutation test of mean(diffs) = 0 by flipping each difference's sign.

    ``p = #{s in {-1,1}^n : |mean(s * d)| >= |mean(d)|} / 2^n`` (Monte Carlo beyond
    ``EXACT_FLIPS_MAX_N`` pairs). Cost ``O(n 2^n)``.
    """
    d = np.asarray(diffs, dtype=np.float64)
    n = d.size
    if n == 0:
        return math.nan
    observed = abs(d.mean())
    tol = 1e-12 * max(1.0, float(np.abs(d).max()))
    if n <= EXACT_FLIPS_MAX_N:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)))
    else:
        rng = np.random.default_rng(seed)
        signs = rng.choice((1.0, -1.0), size=(MONTE_CARLO_SAMPLES, n))
    stats = np.abs((signs * d).mean(axis=1))
    return float(np.mean(stats >= observed - tol))


def paired_test(baseline: Sequence[float], variant: Sequence[float]) -> PairedTest:
    """Paired t-test and sign-flip test of ``variant`` against ``baseline`` (same seed order)."""
    b = np.asarray(baseline, dtype=np.float64)
    v = np.asarray(variant, dtype=np.float64)
    if b.shape != v.shape:
        raise ValueError(f"paired values need equal lengths, got {b.size} and {v.size}")
    n = int(b.size)
    if n == 0:
        return PairedTest(0, math.nan, None, None, "no paired seeds")
    diffs = v - b
    mean_diff = float(diffs.mean())
    if n < 2:
        return PairedTest(n, mean_diff, None, None, "1 seed")
    flip = sign_flip_pvalue(diffs)
    if np.allclose(diffs, diffs[0], rtol=0, atol=1e-15):
        if diffs[0] == 0:
            return PairedTest(n, mean_diff, None, flip, "identical losses")
        return PairedTest(n, mean_diff, 0.0, flip, "")
    p = paired_t_pvalue(v, b)
    return PairedTest(n, mean_diff, p, flip, "")
