"""Parameter matching: the integer search against brute force, on synthetic functions and on
the real parameter count of a small model."""

from __future__ import annotations

import textwrap

import pytest

from attnlab.config import load_config
from attnlab.experiments import closest_integer, load_experiment
from attnlab.model.params import count


def brute(f, target, lo, hi):
    return min(range(lo, hi + 1), key=lambda x: (abs(f(x) - target), x))


@pytest.mark.fast
@pytest.mark.parametrize("target", [0, 1, 7, 50, 51, 52, 999, 1000, 12345])
def test_closest_integer_equals_brute_force_on_a_step_function(target):
    f = lambda x: 3 * (x // 2) + 5  # non-decreasing with plateaus  # noqa: E731
    x, fx = closest_integer(f, target, lo=1, hi=20000)
    assert fx == f(x)
    assert abs(fx - target) == abs(f(brute(f, target, 1, 20000)) - target)
    # a hint that misses the bracket must not change the answer
    assert closest_integer(f, target, lo=1, hint=3)[1] == fx


def test_ties_go_to_the_smaller_width():
    f = lambda x: 10 * x  # noqa: E731
    assert closest_integer(f, 25, lo=1) == (2, 20)


def test_matched_mlp_width_is_the_brute_force_optimum(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text(
        textwrap.dedent(
            """
            base = "tiny"
            [budget]
            steps = 20
            [[variants]]
            name = "baseline"
            [[variants]]
            name = "preproj-skip"
            set = ["model.feature_map.kind=pre_projection", "model.side_branch.kind=content_skip"]
            [[variants]]
            name = "mlp-matched"
            match_params = "preproj-skip"
            """
        ),
        encoding="utf-8",
    )
    exp = load_experiment(path)
    m = exp.variants["mlp-matched"].match
    target = count(exp.variants["preproj-skip"].config.model).non_embedding
    assert m is not None and m.target == target and m.knob == "model.ffn.hidden"

    def n(h: int) -> int:
        return count(load_config("tiny", [f"model.ffn.hidden={h}"]).model).non_embedding

    best = brute(n, target, 330, 410)
    assert m.value == best and m.achieved == n(best)
    assert exp.variants["mlp-matched"].params.non_embedding == m.achieved
    assert exp.variants["mlp-matched"].config.model.ffn.hidden == best
    assert m.rel_gap == pytest.approx((m.achieved - target) / target)
    assert abs(m.achieved - target) <= (n(best + 1) - n(best)) / 2


@pytest.mark.fast
def test_match_by_another_width(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text(
        textwrap.dedent(
            """
            base = "tiny"
            [budget]
            steps = 20
            [[variants]]
            name = "baseline"
            [[variants]]
            name = "no-mlp"
            set = ["model.mlp=false", "model.residual=false", "model.readout.kind=identity_head",
                   "model.mixer.kind=nonlinear"]
            match_params = "baseline"
            match_by = "model.mixer.hidden"
            """
        ),
        encoding="utf-8",
    )
    exp = load_experiment(path)
    m = exp.variants["no-mlp"].match
    assert m.knob == "model.mixer.hidden"
    assert exp.variants["no-mlp"].config.model.mixer.hidden == m.value
    assert abs(m.rel_gap) < 0.01
