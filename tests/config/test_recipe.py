"""One training recipe (attnlab.recipe): pretraining and the probe share its keys with one meaning
each, cut a step into micro-batches the same way and hand the loop the same numbers."""

from __future__ import annotations

import pytest

from attnlab.base.errors import UserError
from attnlab.config import TrainConfig
from attnlab.probe.config import ProbeTrainConfig
from attnlab.recipe import BatchPlan, TrainRecipe
from attnlab.runs.loop import LoopSettings

SHARED = list(TrainRecipe.model_fields)


@pytest.mark.fast
def test_both_protocols_have_every_shared_key_with_its_meaning():
    for cls in (TrainConfig, ProbeTrainConfig):
        for key in SHARED:
            base, here = TrainRecipe.model_fields[key], cls.model_fields[key]
            assert here.annotation == base.annotation, (cls.__name__, key)
            # a protocol may add to a key's description (what 0 means there), never change it
            assert (here.description or "").startswith(base.description or ""), (cls.__name__, key)


def test_each_protocol_keeps_its_own_defaults():
    t, p = TrainConfig(), ProbeTrainConfig()
    assert (t.max_steps, t.batch_size, t.lr, t.min_lr, t.warmup_steps) == (1000, 8, 6e-4, 6e-5, 100)
    assert (t.weight_decay, t.betas, t.eval_every) == (0.1, (0.9, 0.95), 100)
    assert (p.max_steps, p.batch_size, p.lr, p.min_lr, p.warmup_steps) == (500, 16, 1e-5, 0.0, 0)
    assert (p.weight_decay, p.betas, p.eval_every, p.seq_len) == (0.0, (0.9, 0.999), 0, 512)
    assert set(TrainConfig.model_fields) - set(SHARED) == {
        "eval_batches",
        "compile",
        "parallel",
        "objective",
        "mask_prob",
        "init_from",
    }
    assert set(ProbeTrainConfig.model_fields) - set(SHARED) == {"seq_len", "gradient_checkpointing"}


@pytest.mark.parametrize(
    ("tokens", "micro", "seq_len", "world", "accum", "sequences"),
    [
        (None, 8, 128, 1, 1, 8),
        (None, 8, 128, 2, 1, 16),
        (4096, 4, 256, 2, 2, 16),
        (8192, 16, 512, 1, 1, 16),
    ],
)
def test_batch_plan(tokens, micro, seq_len, world, accum, sequences):
    plan = TrainConfig(batch_size=micro, tokens_per_step=tokens).batch_plan(seq_len, world)
    assert plan == BatchPlan(micro, accum, world, seq_len)
    assert plan.sequences == sequences and plan.tokens == sequences * seq_len


def test_a_batch_that_is_not_whole_micro_batches_is_refused():
    with pytest.raises(
        UserError, match=r"tokens_per_step=1000 is not a multiple .* = 512; use 512"
    ):
        TrainConfig(batch_size=4, tokens_per_step=1000).batch_plan(128)


def test_both_protocols_hand_the_loop_the_same_numbers():
    keys = {
        "max_steps": 40,
        "batch_size": 2,
        "tokens_per_step": 512,
        "lr": 3e-3,
        "min_lr": 1e-4,
        "warmup_steps": 5,
        "grad_clip": 0.5,
        "log_every": 3,
        "checkpoint_every": 20,
        "eval_every": 10,
        "spike_factor": 4.0,
    }
    train, probe = TrainConfig(**keys), ProbeTrainConfig(**keys, seq_len=64)
    a = LoopSettings.from_recipe(train, train.batch_plan(64))
    b = LoopSettings.from_recipe(probe, probe.plan)
    assert a == b
    assert (a.max_steps, a.accum, a.tokens_per_step, a.grad_clip, a.eval_at_end) == (
        40,
        4,
        512,
        0.5,
        True,
    )
