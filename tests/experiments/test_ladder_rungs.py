"""The ladder's size rule (attnlab.experiments.scaling.sizes): shapes, token budgets and compute
per rung, and the MLP-widened control matched through compare's own matching at every rung."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from attnlab.config import ConfigError, load_config
from attnlab.experiments.scaling import SizeRule, paper_sizes, rung_experiment, shape
from attnlab.experiments.spec import parse_experiment
from attnlab.model.params import count

PREPROJ_SKIP = ["model.feature_map.kind=pre_projection", "model.side_branch.kind=content_skip"]
RUNGS = 5


@pytest.fixture(scope="module")
def spec():
    return parse_experiment(
        {
            "base": "tiny",
            "budget": {"steps": 10},
            "seeds": [0, 1],
            "variants": [
                {"name": "baseline"},
                {"name": "preproj-skip", "set": PREPROJ_SKIP},
                {"name": "mlp-matched", "match_params": "preproj-skip"},
            ],
        }
    )


@pytest.fixture(scope="module")
def rungs(spec):
    return [rung_experiment(spec, SizeRule(), i) for i in range(RUNGS)]


@pytest.mark.fast
def test_width_and_depth_grow_together_with_heads_of_one_size():
    rule = SizeRule(base_width=64, growth=2**0.5, head_dim=16, aspect=32)
    shapes = [shape(rule, i) for i in range(7)]
    assert shapes[0].d_model == 64 and shapes[-1].d_model == 512
    for s in shapes:
        assert s.n_heads * s.head_dim == s.d_model and s.head_dim == 16
        assert s.n_layers == max(2, round(s.d_model / 32))
        ideal = 64 * 2 ** (s.index / 2)
        assert abs(s.d_model - ideal) <= 8  # the nearest whole number of heads
    assert [s.d_model for s in shapes] == sorted({s.d_model for s in shapes})
    assert [s.n_layers for s in shapes] == sorted(s.n_layers for s in shapes)
    explicit = SizeRule(widths=[32, 48, 96], head_dim=16, aspect=16)
    assert [shape(explicit, i).n_layers for i in range(3)] == [2, 3, 6]


@pytest.mark.fast
def test_bad_rules_and_indices_name_the_fix():
    with pytest.raises(ValidationError, match="multiples of head_dim=16"):
        SizeRule(widths=[64, 72])
    with pytest.raises(ConfigError, match=r"rung index 3 is out of range \(0..1\)"):
        shape(SizeRule(widths=[32, 64]), 3)


def test_every_rung_has_its_shape_and_a_budget_proportional_to_n(rungs):
    rule = SizeRule()
    for r in rungs:
        exp = r.experiment
        n = r.sizes["baseline"].non_embedding
        for v in exp.variants.values():
            m = v.config.model
            assert (m.d_model, m.n_layers, m.attention.n_heads) == (
                r.shape.d_model,
                r.shape.n_layers,
                r.shape.n_heads,
            )
            assert v.config.train.max_steps == r.steps  # the same budget for every variant
        assert n == count(exp.variants["baseline"].config.model).non_embedding
        per_step = exp.tokens_per_step
        assert r.tokens == r.steps * per_step
        assert rule.tokens_per_param * n <= r.tokens < rule.tokens_per_param * n + per_step
    sizes = [r.sizes["baseline"].non_embedding for r in rungs]
    assert sizes == sorted(sizes) and len(set(sizes)) == RUNGS


def test_compute_is_6nd_and_the_flop_counters_number(rungs):
    """C = 6 N D; C_flops = 3 F D with F, for the GELU baseline without biases, by hand:
    2 x 12 d^2 per layer (Q, K, V, O and the 4d MLP), 4 T d per layer (q k^T and p v) and
    2 d V for the LM head."""
    for r in rungs:
        size = r.sizes["baseline"]
        cfg = r.experiment.variants["baseline"].config
        d, L, V, T = cfg.model.d_model, cfg.model.n_layers, cfg.model.vocab_size, cfg.data.seq_len
        assert size.compute == 6 * size.non_embedding * r.tokens
        assert size.flops_per_token == 2 * 12 * d * d * L + 4 * T * d * L + 2 * d * V
        assert size.compute_flops == 3 * size.flops_per_token * r.tokens


def test_the_mlp_widened_control_is_matched_at_every_rung(rungs):
    """compare's matching, called per rung: the control's N is the closest an MLP width can
    get to pre-projection + content skip's, checked against the neighbouring widths."""
    for r in rungs:
        exp = r.experiment
        m = exp.variants["mlp-matched"].match
        target = r.sizes["preproj-skip"].non_embedding
        assert m is not None and m.target == target and m.knob == "model.ffn.hidden"
        assert r.sizes["mlp-matched"].non_embedding == m.achieved
        cfg = exp.variants["mlp-matched"].config

        def n(h: int, cfg=cfg) -> int:
            return count(
                cfg.model.model_copy(update={"ffn": cfg.model.ffn.model_copy(update={"hidden": h})})
            ).non_embedding

        assert cfg.model.ffn.hidden == m.value
        assert abs(n(m.value) - target) <= abs(n(m.value - 1) - target)
        assert abs(n(m.value) - target) <= abs(n(m.value + 1) - target)
        assert abs(m.rel_gap) < 0.01
    widths = [r.experiment.variants["mlp-matched"].config.model.ffn.hidden for r in rungs]
    assert widths == sorted(widths) and len(set(widths)) == RUNGS  # re-matched, not carried over


def test_the_papers_sizes_are_counted():
    sizes = paper_sizes()
    assert sizes["124M"] == count(load_config("gpt2-124m").model).non_embedding
    assert math.isclose(sizes["124M"], 85e6, rel_tol=0.01)  # GPT-2 small: 85M without embeddings
    assert sizes["1B"] == 805_736_448  # Pythia-1B's non-embedding count (Biderman et al. 2023)
