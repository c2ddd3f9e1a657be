"""Statistics, curves and the ETA model: hand-computed values and scipy as the reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from attnlab.experiments.reports.curves import band, relative_curve
from attnlab.experiments.reports.stats import (
    mean_std,
    paired_test,
    relative_improvement,
    sign_flip_pvalue,
)
from attnlab.experiments.running.progress import EtaModel


def test_mean_and_sample_std():
    m, s = mean_std([2.0, 4.0, 9.0])
    assert m == pytest.approx(5.0)
    assert s == pytest.approx(math.sqrt(((2 - 5) ** 2 + (4 - 5) ** 2 + (9 - 5) ** 2) / 2))
    m1, s1 = mean_std([3.0])
    assert m1 == 3.0 and math.isnan(s1)
    assert all(math.isnan(x) for x in mean_std([]))


def test_relative_improvement_is_positive_when_the_variant_has_lower_loss():
    # seed 001: 2.956 -> 2.915 is a 1.39% improvement
    assert relative_improvement(2.956, 2.915) == pytest.approx(100 * 0.041 / 2.956)
    assert relative_improvement(2.956, 2.915) > 0
    assert relative_improvement(3.0, 3.3) == pytest.approx(-10.0)
    assert math.isnan(relative_improvement(3.0, math.nan))


@pytest.mark.fast
def test_paired_t_test_matches_the_formula_and_scipy():
    base = [3.10, 3.05, 3.20, 3.12]
    var = [3.02, 3.01, 3.15, 3.11]
    d = np.array(var) - np.array(base)
    t = d.mean() / (d.std(ddof=1) / math.sqrt(len(d)))
    expected = 2 * sps.t.sf(abs(t), df=len(d) - 1)
    res = paired_test(base, var)
    assert res.n == 4 and res.mean_diff == pytest.approx(d.mean())
    assert res.p_ttest == pytest.approx(expected, rel=1e-9)
    assert res.p_ttest == pytest.approx(sps.ttest_rel(var, base).pvalue, rel=1e-9)
    assert 0.01 < res.p_ttest < 0.2


def test_one_seed_has_no_p_value():
    res = paired_test([3.0], [2.9])
    assert res.p_ttest is None and res.describe_t() == "n/a (1 seed)"


def test_sign_flip_test_is_exact():
    # all 3 differences negative: only the all-same-sign flips reach |mean| -> 2 / 8
    assert sign_flip_pvalue([-0.1, -0.2, -0.3]) == pytest.approx(0.25)
    # 2 seeds can never go below 0.5
    assert sign_flip_pvalue([-1.0, -2.0]) == pytest.approx(0.5)
    # mixed signs: flips whose |mean| >= |0.1 - 0.3 + 0.5| / 3 counted by brute force
    d = np.array([0.1, -0.3, 0.5])
    signs = np.array([[a, b, c] for a in (1, -1) for b in (1, -1) for c in (1, -1)])
    expected = np.mean(np.abs((signs * d).mean(1)) >= abs(d.mean()) - 1e-12)
    assert sign_flip_pvalue(d) == pytest.approx(expected)


def test_identical_losses_give_no_t_test():
    res = paired_test([3.0, 3.1], [3.0, 3.1])
    assert res.p_ttest is None and "identical" in res.describe_t()


def test_band_and_seed_paired_relative_curve():
    b = band([[(10, 4.0), (20, 3.0)], [(10, 5.0), (20, 3.5), (30, 3.2)]])
    assert list(b.steps) == [10, 20, 30]
    assert list(b.mean) == pytest.approx([4.5, 3.25, 3.2])
    assert list(b.lo) == [4.0, 3.0, 3.2] and list(b.hi) == [5.0, 3.5, 3.2]
    assert list(b.n) == [2, 2, 1]
    base = {0: [(10, 4.0), (20, 2.0)], 1: [(10, 5.0), (20, 2.5)]}
    var = {0: [(10, 3.0), (20, 2.0)], 1: [(10, 5.5), (20, 2.0)], 2: [(10, 1.0)]}
    r = relative_curve(base, var)
    # seed 0: +25%, 0%; seed 1: -10%, +20%; seed 2 has no baseline and is left out
    assert list(r.steps) == [10, 20]
    assert list(r.mean) == pytest.approx([7.5, 10.0])
    assert list(r.lo) == pytest.approx([-10.0, 0.0]) and list(r.hi) == pytest.approx([25.0, 20.0])


def test_eta_uses_measured_rates_and_scales_unmeasured_ones_by_flops():
    eta = EtaModel(flops={"a": 100.0, "b": 200.0, "c": 50.0})
    assert eta.remaining([("a", 10, False)]) is None  # nothing measured yet
    eta.record("a", 0.5)
    assert eta.remaining([("a", 10, True)]) == pytest.approx(5.0)
    assert eta.rate("b") == pytest.approx(1.0)  # twice the FLOPs, twice the time
    work = [("a", 10, True), ("b", 4, False), ("c", 8, False)]
    assert eta.remaining(work) == pytest.approx(5 + 4 + 2)
    eta.record_overhead(3.0)
    # a started run has paid its setup; each later run adds the measured overhead
    assert eta.remaining(work) == pytest.approx(5 + (4 + 3) + (2 + 3))
    # two at a time: half the total, but never less than the longest run
    assert eta.remaining(work, jobs=2) == pytest.approx((5 + 7 + 5) / 2)
    assert eta.remaining([("a", 10, True), ("c", 2, False)], jobs=4) == pytest.approx(5.0)
