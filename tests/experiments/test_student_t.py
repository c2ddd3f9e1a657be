"""The SciPy-free paired t-test agrees with scipy.stats.ttest_rel, and with closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnlab.experiments.reports.stats import paired_test
from attnlab.experiments.reports.student_t import paired_t_pvalue, regularized_beta, t_two_sided_p

scipy_stats = pytest.importorskip("scipy.stats")


@pytest.mark.parametrize("n", [2, 3, 5, 8, 17, 40])
def test_paired_pvalue_matches_scipy(n: int) -> None:
    rng = np.random.default_rng(n)
    for shift in (0.0, 0.3, 1.5, 8.0):
        b = rng.normal(3.0, 0.1, n)
        v = b + rng.normal(shift * 0.05, 0.05, n)
        want = float(scipy_stats.ttest_rel(v, b).pvalue)
        assert paired_t_pvalue(v, b) == pytest.approx(want, rel=1e-9, abs=1e-300)
        assert paired_test(b, v).p_ttest == pytest.approx(want, rel=1e-9, abs=1e-300)


def test_tail_keeps_relative_precision() -> None:
    # t = 60 with 4 df: p is about 4.6e-7; a 1 - CDF form would lose digits, the CF does not.
    for t, df in ((60.0, 4), (1e3, 9), (25.0, 30)):
        want = float(2 * scipy_stats.t.sf(t, df))
        assert t_two_sided_p(t, df) == pytest.approx(want, rel=1e-9)


def test_closed_forms() -> None:
    # df = 1 is the Cauchy distribution: p = 1 - 2 atan(|t|) / pi.
    for t in (0.1, 1.0, 2.0, 7.5):
        assert t_two_sided_p(t, 1) == pytest.approx(1 - 2 * math.atan(t) / math.pi, rel=1e-12)
    # df = 2: p = 1 - |t| / sqrt(2 + t^2).
    for t in (0.3, 1.0, 4.0):
        assert t_two_sided_p(t, 2) == pytest.approx(1 - t / math.sqrt(2 + t * t), rel=1e-12)
    assert t_two_sided_p(0.0, 5) == pytest.approx(1.0)
    assert t_two_sided_p(math.inf, 5) == 0.0
    # I_x(1, 1) = x (the uniform distribution); I_x(a, b) = 1 - I_{1-x}(b, a).
    assert regularized_beta(1.0, 1.0, 0.37) == pytest.approx(0.37, rel=1e-12)
    assert regularized_beta(2.5, 0.5, 0.8) == pytest.approx(
        1 - regularized_beta(0.5, 2.5, 0.2), rel=1e-12
    )


def test_undefined_cases_are_nan() -> None:
    assert math.isnan(paired_t_pvalue([1.0], [2.0]))
    assert math.isnan(paired_t_pvalue([1.0, 2.0], [0.0, 1.0]))  # equal differences: std 0
