"""Scaling-law fits (attnlab.experiments.scaling): the fit against scipy on noise-free and noisy
data, the bootstrap's coverage of a known curve, the honesty checks, the gap's trend and
extrapolation, and what the two figures must show."""

from __future__ import annotations

import math

import numpy as np
import pytest
from matplotlib.collections import PolyCollection
from scipy.optimize import curve_fit, least_squares

from attnlab.base.errors import UserError
from attnlab.experiments.reports.scaling_plots import (
    EXTRAPOLATION,
    gap_vs_size,
    gap_vs_size_figure,
    loss_vs_size_figure,
)
from attnlab.experiments.scaling import (
    FitSettings,
    RungLosses,
    compare_scaling,
    fit_scaling,
    ladder_data,
)
from attnlab.experiments.scaling.power_law import fit_one

TRUE = {"E": 1.8, "A": 400.0, "alpha": 0.34}
SIZES = np.geomspace(1e5, 3e7, 6)


def curve(x, E=TRUE["E"], A=TRUE["A"], alpha=TRUE["alpha"]):
    return E + A * np.asarray(x, dtype=np.float64) ** -alpha


def ladder(rng, *, seeds=3, noise=0.01, sizes=SIZES, f=curve, shared=None):
    """Rungs whose runs are f(x) x exp(noise), with ``shared[(i, s)]`` added when given."""
    out = []
    for i, x in enumerate(sizes):
        losses = {}
        for s in range(seeds):
            eps = noise * rng.standard_normal() + (shared[i, s] if shared is not None else 0.0)
            losses[s] = float(f(x) * math.exp(eps))
        out.append(RungLosses(float(x), losses))
    return out


def points(rungs):
    x = np.array([r.x for r in rungs for _ in r.losses])
    y = np.log([v for r in rungs for v in r.losses.values()])
    return x, y


def log_model(x, E, A, alpha):
    return np.log(E + A * x**-alpha)


# ------------------------------------------------------------------------------ the fit itself


@pytest.mark.parametrize("loss", ["huber", "squares"])
def test_noise_free_data_give_the_curve_back_as_scipy_does(loss):
    rungs = ladder(np.random.default_rng(0), seeds=2, noise=0.0)
    x, y = points(rungs)
    got = fit_one(x, y, loss=loss, delta=1e-3)
    ref, _ = curve_fit(log_model, x, y, p0=[1.0, 100.0, 0.5], bounds=(0, [10, 1e4, 2]))
    for value, want, ours in zip(ref, TRUE.values(), (got.E, got.A, got.alpha)):
        assert ours == pytest.approx(want, rel=1e-6)
        assert value == pytest.approx(want, rel=1e-4)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_least_squares_on_noisy_data_is_curve_fits_optimum(seed):
    x, y = points(ladder(np.random.default_rng(seed), seeds=2, noise=0.02))
    ours = fit_one(x, y, loss="squares")
    ref, _ = curve_fit(log_model, x, y, p0=[1.5, 300.0, 0.3], bounds=(0, [10, 1e4, 2]))
    assert [ours.E, ours.A, ours.alpha] == pytest.approx(list(ref), rel=1e-5)
    # and no other point has a lower sum of squares: ours is at least as good as scipy's
    sq = lambda p: float(((y - log_model(x, *p)) ** 2).sum())  # noqa: E731
    assert sq((ours.E, ours.A, ours.alpha)) <= sq(ref) * (1 + 1e-9)


@pytest.mark.parametrize("seed", [4, 5])
def test_huber_on_noisy_data_is_scipys_huber_optimum(seed):
    rng = np.random.default_rng(seed)
    rungs = ladder(rng, seeds=3, noise=0.01)
    rungs[2] = RungLosses(rungs[2].x, {**rungs[2].losses, 0: rungs[2].losses[0] * 1.08})  # outlier
    x, y = points(rungs)
    delta = 0.0134
    ours = fit_one(x, y, loss="huber", delta=delta)
    ref = least_squares(
        lambda p: y - log_model(x, *p),
        x0=[1.5, 300.0, 0.3],
        loss="huber",
        f_scale=delta,
        x_scale=[1.0, 100.0, 0.1],
        xtol=1e-15,
        ftol=1e-15,
        gtol=1e-15,
        max_nfev=20000,
    )
    assert [ours.E, ours.A, ours.alpha] == pytest.approx(list(ref.x), rel=1e-4)
    plain = fit_one(x, y, loss="squares")
    # the outlier pulls least squares further from the truth than Huber
    assert abs(ours.alpha - TRUE["alpha"]) < abs(plain.alpha - TRUE["alpha"])


# ------------------------------------------------------------------------------ the intervals


def _coverage(level: float, datasets: int = 30) -> dict[str, float]:
    hits = dict.fromkeys(TRUE, 0)
    settings = FitSettings(n_boot=200, level=level)
    for k in range(datasets):
        fit = fit_scaling(ladder(np.random.default_rng(1000 + k), seeds=3), settings)
        for name, truth in TRUE.items():
            lo, hi = fit.interval(name)
            hits[name] += lo <= truth <= hi
    return {n: h / datasets for n, h in hits.items()}


def test_intervals_cover_the_true_curve_about_as_often_as_they_say():
    """95% intervals hold the truth in most of 30 synthetic ladders; 50% ones in about half
    (both ends of calibration: not too narrow, not too wide)."""
    for name, c in _coverage(0.95).items():
        assert c >= 0.8, f"95% interval of {name} covered only {c:.0%}"
    for name, c in _coverage(0.5).items():
        assert 0.25 <= c <= 0.75, f"50% interval of {name} covered {c:.0%}"


def test_the_bootstrap_is_seeded_and_predicts_at_any_size():
    rungs = ladder(np.random.default_rng(7), seeds=2)
    a, b = fit_scaling(rungs), fit_scaling(rungs)
    c = fit_scaling(rungs, FitSettings(seed=1))
    assert a.interval("alpha") == b.interval("alpha")
    assert a.interval("alpha") != c.interval("alpha")
    band = a.predict([3e5, 1e9])
    assert np.all(band.lo <= band.mid) and np.all(band.mid <= band.hi)
    assert band.mid == pytest.approx(curve([3e5, 1e9]), rel=0.05)
    # the band widens away from the data
    width = band.hi - band.lo
    assert width[1] / band.mid[1] > width[0] / band.mid[0]
    assert a.trustworthy and "alpha = " in a.summary() and "seeds resampled" in a.summary()


def test_rungs_resampling_is_wider_than_seeds_alone():
    rungs = ladder(np.random.default_rng(8), seeds=2)
    seeds = fit_scaling(rungs, FitSettings(n_boot=300))
    both = fit_scaling(rungs, FitSettings(n_boot=300, resample="rungs"))
    w = lambda f: np.subtract(*f.interval("alpha")[::-1])  # noqa: E731
    assert w(both) > w(seeds)


# ------------------------------------------------------------------------------ honesty


def _says_no_number(fit, *needles):
    text = fit.summary()
    assert not fit.trustworthy and "no trusted fit" in text
    assert "N^-alpha with" not in text
    for needle in needles:
        assert needle in text, text


def test_three_rungs_are_too_few():
    fit = fit_scaling(ladder(np.random.default_rng(0), sizes=SIZES[:3]))
    _says_no_number(fit, "only 3 rung(s)")


def test_a_diverged_run_is_named():
    rungs = ladder(np.random.default_rng(0))
    rungs[4] = RungLosses(rungs[4].x, {**rungs[4].losses, 1: float("nan")})
    fit = fit_scaling(rungs)
    _says_no_number(fit, "diverged", "seed 1", f"N={rungs[4].x:.3g}")
    marked = RungLosses(rungs[3].x, rungs[3].losses, diverged=frozenset({2}))
    _says_no_number(fit_scaling([*rungs[:3], marked, *rungs[5:]]), "seed 2")


def test_curvature_in_the_residuals_is_flagged():
    """A ladder that bends (the loss turns up at the top: a learning rate that stopped
    transferring) has no single power law; the honest answer is no number."""
    bent = lambda x: curve(x) * np.exp(0.04 * (np.log(x / 1e5) / np.log(300)) ** 3)  # noqa: E731
    fit = fit_scaling(ladder(np.random.default_rng(1), seeds=3, noise=0.002, f=bent))
    assert any("curve in log N" in p or "off the curve" in p for p in fit.problems), fit.problems
    _says_no_number(fit)


def test_flat_data_put_alpha_at_its_bound_or_give_wide_intervals():
    flat = lambda x: np.full_like(np.asarray(x, dtype=float), 3.0)  # noqa: E731
    fit = fit_scaling(ladder(np.random.default_rng(2), f=flat))
    _says_no_number(fit)
    assert any("bound" in p or "wider than" in p for p in fit.problems)


def test_one_seed_per_rung_gives_no_interval():
    fit = fit_scaling(ladder(np.random.default_rng(3), seeds=1))
    assert fit.interval("alpha") is None and fit.curve is not None
    _says_no_number(fit, "one seed per rung")


def test_a_narrow_noisy_ladder_has_intervals_wider_than_its_values():
    fit = fit_scaling(ladder(np.random.default_rng(4), sizes=np.geomspace(1e6, 2e6, 5), noise=0.03))
    _says_no_number(fit, "wider than")


@pytest.mark.parametrize(
    ("rungs", "needle"),
    [
        ([RungLosses(1e5, {0: 3.0}), RungLosses(1e5, {0: 2.9})], "same size"),
        ([RungLosses(-1.0, {0: 3.0})], "positive numbers"),
        ([RungLosses(1e5, {0: -3.0})], "not positive"),
        ([], "needs rungs"),
    ],
)
def test_bad_ladders_are_user_errors(rungs, needle):
    with pytest.raises(UserError, match=needle):
        ladder_data(rungs)


# ------------------------------------------------------------------------------ the gap


def _pair(rng, gap_at, seeds=2, noise=0.01, own=0.002):
    """Baseline on the true curve, variant lower by gap_at(x) nats; shared seed noise."""
    shared = {
        (i, s): noise * rng.standard_normal() for i in range(len(SIZES)) for s in range(seeds)
    }
    b = ladder(rng, seeds=seeds, noise=own, shared=shared)
    v = ladder(rng, seeds=seeds, noise=own, shared=shared, f=lambda x: curve(x) - gap_at(x))
    return b, v


@pytest.mark.parametrize(
    ("slope", "word", "sense"),
    [(0.02, "grows", "widens"), (-0.02, "shrinks", "narrows"), (0.0, "is flat", "")],
)
def test_the_gaps_trend_is_read_from_its_slope(slope, word, sense):
    gap_at = lambda x: 0.1 + slope * np.log10(np.asarray(x) / 1e5)  # noqa: E731
    pair = _pair(np.random.default_rng(3), gap_at, own=0.0005)
    g = compare_scaling(*pair, names=("baseline", "nlq"))
    lo, hi = g.slope_interval()
    assert g.paired and lo <= slope <= hi
    assert g.trend() == word
    text = g.verdict()
    assert f"{word} with N" in text and f"slope {g.slope:+.4f}" in text and "paired" in text
    assert f"[{lo:+.4f}, {hi:+.4f}]" in text
    if sense:
        assert f"advantage of nlq {sense}" in text


def test_the_slope_interval_covers_the_true_slope_about_as_often_as_it_says():
    gap_at = lambda x: 0.1 + 0.02 * np.log10(np.asarray(x) / 1e5)  # noqa: E731
    hits = 0
    for k in range(20):
        pair = _pair(np.random.default_rng(500 + k), gap_at, own=0.0005)
        lo, hi = compare_scaling(*pair, FitSettings(n_boot=200)).slope_interval()
        hits += lo <= 0.02 <= hi
    assert hits >= 16


def test_pairing_narrows_the_slope_interval():
    rng = np.random.default_rng(12)
    b, v = _pair(rng, lambda x: 0.05 + 0 * np.asarray(x), noise=0.02, own=0.001)
    paired = compare_scaling(b, v)
    # the same runs under other seed numbers cannot be paired
    v_other = [RungLosses(r.x, {s + 10: loss for s, loss in r.losses.items()}) for r in v]
    unpaired = compare_scaling(b, v_other)
    assert not unpaired.paired and "unpaired" in unpaired.verdict()
    width = lambda g: np.subtract(*g.slope_interval()[::-1])  # noqa: E731
    assert width(paired) < width(unpaired) / 3


def test_extrapolation_is_marked_and_refused_for_an_untrusted_fit():
    rng = np.random.default_rng(13)
    gap_at = lambda x: 0.05 + 0 * np.asarray(x)  # noqa: E731
    g = compare_scaling(*_pair(rng, gap_at), names=("baseline", "nlq"))
    targets = {"mid": 1e6, "124M": 8.5e7, "1B": 8.06e8}
    pts = {p.label: p for p in g.at(targets)}
    assert not pts["mid"].extrapolated and pts["124M"].extrapolated and pts["1B"].extrapolated
    for p in pts.values():
        assert p.lo <= p.mid <= p.hi
        assert p.lo <= 0.05 <= p.hi
    text = g.extrapolation(targets)
    assert "at 124M" in text and "extrapolation" in text and "in range" in text
    b, v = _pair(rng, gap_at)
    few = compare_scaling(b[:3], v[:3])
    assert few.trend() is None and "no verdict" in few.verdict()
    assert few.extrapolation(targets).startswith("no fitted gap")


# ------------------------------------------------------------------------------ the figures


def _fits_and_gap(trusted_variant: bool = True):
    rng = np.random.default_rng(21)
    b, v = _pair(rng, lambda x: 0.05 + 0.01 * np.log10(np.asarray(x) / 1e5))
    if not trusted_variant:
        v = v[:3]
        b = b[:3]
    g = compare_scaling(b, v, names=("baseline", "nlq"))
    return {"baseline": g.baseline, "nlq": g.variant}, g


TARGETS = {"124M": 8.5e7, "1B": 8.06e8}


def test_loss_figure_shows_points_curves_bands_and_the_extrapolation():
    fits, _ = _fits_and_gap()
    ax = loss_vs_size_figure(fits, TARGETS).axes[0]
    assert ax.get_xscale() == "log"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["baseline", "nlq"]
    top = max(f.data.x.max() for f in fits.values())
    for name, fit in fits.items():
        scatter = next(c for c in ax.collections if c.get_label() == name)
        assert len(scatter.get_offsets()) == int(fit.data.mask.sum())
    bands = [c for c in ax.collections if isinstance(c, PolyCollection) and c.get_label() != "nlq"]
    fills = [c for c in bands if len(c.get_paths()[0].vertices) > 10]
    assert len(fills) >= 2  # one band per fit, plus the shaded extrapolation
    solid = [ln for ln in ax.get_lines() if ln.get_linestyle() == "-" and len(ln.get_xdata()) > 2]
    dashed = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
    assert len(solid) == 2 and len(dashed) == 2
    for ln in solid:  # the curve over the ladder ends where the ladder does
        assert max(ln.get_xdata()) == pytest.approx(top)
    for ln in dashed:  # and continues, dashed, to the largest named size
        assert min(ln.get_xdata()) == pytest.approx(top)
        assert max(ln.get_xdata()) == pytest.approx(TARGETS["1B"])
    # the solid curve is the fit's prediction, inside its band
    fit = fits["baseline"]
    xs, ys = solid[0].get_xdata(), solid[0].get_ydata()
    band = fit.predict(xs)
    assert ys == pytest.approx(fit.curve(xs))
    assert np.all(band.lo <= ys + 1e-12) and np.all(ys <= band.hi + 1e-12)
    texts = [t.get_text().strip() for t in ax.texts]
    assert EXTRAPOLATION in texts and "124M" in texts and "1B" in texts
    vlines = {ln.get_xdata()[0] for ln in ax.get_lines() if ln.get_linestyle() == ":"}
    assert vlines == set(TARGETS.values())


def test_an_untrusted_fit_is_drawn_as_points_only():
    fits, _ = _fits_and_gap(trusted_variant=False)
    ax = loss_vs_size_figure(fits, TARGETS).axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["baseline (no trusted fit)", "nlq (no trusted fit)"]
    assert [ln for ln in ax.get_lines() if ln.get_linestyle() in ("-", "--")] == []


def test_gap_figure_shows_the_trend_the_band_and_the_named_sizes(tmp_path):
    _, g = _fits_and_gap()
    ax = gap_vs_size_figure(g, TARGETS).axes[0]
    assert ax.get_xscale() == "log"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    lo, hi = g.slope_interval()
    assert f"trend {g.slope:+.4f} nats/decade [{lo:+.4f}, {hi:+.4f}]" in labels
    assert "124M (extrapolation)" in labels and "1B (extrapolation)" in labels
    assert any(ln.get_ydata()[0] == 0 for ln in ax.get_lines() if len(ln.get_ydata()) == 2)
    observed = next(c for c in ax.collections if c.get_label().startswith("observed"))
    assert np.asarray(observed.get_offsets())[:, 1] == pytest.approx(g.observed)
    assert EXTRAPOLATION in [t.get_text() for t in ax.texts]
    path = gap_vs_size(g, tmp_path / "plots" / "gap.png", TARGETS)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
