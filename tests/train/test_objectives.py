"""Masked LM and span corruption: what is hidden, what is predicted, and reproducibility."""

from __future__ import annotations

import numpy as np
import pytest

from attnlab.base.errors import UserError
from attnlab.config import load_config
from attnlab.runs.divergence import DivergenceMonitor
from attnlab.train.objectives import (
    corruption_rng,
    extra_ids,
    make_batch,
    masked_lm,
    resolve_objective,
    span_corruption,
    span_counts,
)

V = 100


def _tokens(n: int, T: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, V, size=(n, T))


def test_masked_lm_predicts_exactly_the_chosen_positions_with_80_10_10():
    x = _tokens(400, 40)
    inp, tgt = masked_lm(x, np.random.default_rng(1), vocab=V, mask_prob=0.15)
    chosen = tgt != -100
    assert (chosen.sum(1) == 6).all()  # round(0.15 * 40) per row
    assert (tgt[chosen] == x[chosen]).all()
    assert (inp[~chosen] == x[~chosen]).all()  # nothing else is touched
    masked = (inp[chosen] == V).mean()
    kept = (inp[chosen] == x[chosen]).mean()
    assert 0.76 < masked < 0.84
    # 10% unchanged plus random tokens that happen to equal the original (1/V of 10%)
    assert 0.07 < kept < 0.13
    assert inp.max() <= V


def test_span_corruption_round_trips_to_the_original_sequence():
    x = _tokens(5, 64, seed=3)
    enc, dec_in, tgt = span_corruption(x, np.random.default_rng(2), vocab=V, density=0.15, eos_id=7)
    n_noise, n_spans = span_counts(64, 0.15)
    assert enc.shape == (5, 64 - n_noise + n_spans)
    assert tgt.shape == dec_in.shape == (5, n_noise + n_spans + 1)
    assert (tgt[:, -1] == 7).all() and (dec_in[:, 0] == 7).all()
    assert (dec_in[:, 1:] == tgt[:, :-1]).all()
    for row in range(5):
        # put the target spans back at their sentinels: the original sequence reappears
        spans, cur = {}, None
        for tok in tgt[row, :-1]:
            if tok > V:
                cur = int(tok)
                spans[cur] = []
            else:
                spans[cur].append(int(tok))
        rebuilt = []
        for tok in enc[row]:
            rebuilt.extend(spans[int(tok)] if tok > V else [int(tok)])
        assert rebuilt == x[row].tolist()
        sentinels = [int(t) for t in enc[row] if t > V]
        assert sentinels == list(range(V + 1, V + 1 + n_spans))


def test_corruption_depends_only_on_seed_step_and_index():
    x = _tokens(4, 32)
    a = make_batch(
        "masked_lm", x, x, corruption_rng(5, 10, 3), vocab=V, mask_prob=0.15, eos_id=None
    )
    b = make_batch(
        "masked_lm", x, x, corruption_rng(5, 10, 3), vocab=V, mask_prob=0.15, eos_id=None
    )
    c = make_batch(
        "masked_lm", x, x, corruption_rng(5, 11, 3), vocab=V, mask_prob=0.15, eos_id=None
    )
    assert (a.input_ids == b.input_ids).all() and (a.targets == b.targets).all()
    assert not (a.targets == c.targets).all()


@pytest.mark.fast
def test_causal_lm_batch_is_the_shifted_window():
    x = _tokens(2, 8)
    b = make_batch("causal_lm", x[:, :-1], x[:, 1:], None, vocab=V, mask_prob=0.15, eos_id=None)
    assert b.encoder_input_ids is None and b.n_targets == 14
    assert (b.targets[:, :-1] == b.input_ids[:, 1:]).all()


def test_objective_follows_the_family_and_refuses_a_mismatch():
    cfg = load_config("tiny")
    assert resolve_objective(cfg.model, cfg.train) == "causal_lm"
    enc = load_config("tiny", ["model.family=encoder", "model.mask.kind=full"])
    assert resolve_objective(enc.model, enc.train) == "masked_lm"
    bad = load_config("tiny", ["train.objective=masked_lm"])
    with pytest.raises(UserError, match=r"does not fit model\.family=.decoder."):
        resolve_objective(bad.model, bad.train)
    assert extra_ids("causal_lm", 64, 0.15) == 0
    assert extra_ids("masked_lm", 64, 0.15) == 1
    assert extra_ids("span_corruption", 64, 0.15) == 1 + span_counts(64, 0.15)[1]


def test_divergence_monitor_nan_and_spike():
    m = DivergenceMonitor(spike_factor=0.0)
    assert m.check(5.0, 1.0) is None
    assert "nan" in m.check(float("nan"), 1.0)
    assert "gradient norm is inf" in m.check(5.0, float("inf"))
    assert m.check(1e6) is None  # spikes are allowed when spike_factor is 0
    s = DivergenceMonitor(spike_factor=2.0)
    for loss in (4.0, 3.0, 2.0, 2.0, 2.0):
        assert s.check(loss) is None
    best = s.best_smoothed
    assert s.check(2.0 * best * 0.99) is None
    reason = s.check(2.0 * best * 1.5)
    assert reason is not None and "spike_factor=2.0" in reason
    t = DivergenceMonitor(2.0)
    t.load_state_dict(s.state_dict())
    assert (t.ema, t.n, t.best_smoothed) == (s.ema, s.n, s.best_smoothed)
