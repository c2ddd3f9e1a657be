"""AdamW grouping, the warmup + cosine schedule, accumulation arithmetic, peak FLOP/s and MFU."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn

from attnlab.base.errors import UserError
from attnlab.recipe import grad_accum_steps
from attnlab.runs.optim import build_optimizer, lr_at, param_groups
from attnlab.runs.peak import measure_peak_flops, mfu
from attnlab.train.batches import micro_offsets


@pytest.mark.fast
def test_lr_warmup_is_linear_then_cosine_reaches_min():
    kw = {"lr": 1.0, "min_lr": 0.1, "warmup_steps": 4, "max_steps": 14}
    assert [lr_at(s, **kw) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_at(4, **kw) == pytest.approx(1.0)
    # half-way through the decay the cosine is at the mean of lr and min_lr
    assert lr_at(9, **kw) == pytest.approx(0.55)
    assert lr_at(14, **kw) == pytest.approx(0.1)
    decay = [lr_at(s, **kw) for s in range(4, 15)]
    assert all(a > b for a, b in itertools.pairwise(decay))
    expected = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 3 / 10))
    assert lr_at(7, **kw) == pytest.approx(expected)


def test_lr_without_warmup_starts_at_peak():
    assert lr_at(0, lr=3e-3, min_lr=0.0, warmup_steps=0, max_steps=10) == pytest.approx(3e-3)


class _Plain(nn.Module):
    """No param_groups(): the trainer's own >= 2-D rule applies."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.lin = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight  # tied: must appear once


def test_param_groups_decay_only_matrices_and_count_tied_once():
    m = _Plain()
    decay, no_decay = param_groups(m, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert {id(p) for p in decay["params"]} == {id(m.emb.weight), id(m.lin.weight)}
    assert {id(p) for p in no_decay["params"]} == {
        id(m.lin.bias),
        id(m.norm.weight),
        id(m.norm.bias),
    }


def test_param_groups_prefers_the_models_own():
    class Own(_Plain):
        def param_groups(self, wd):
            return [{"params": list(self.parameters()), "weight_decay": wd * 2}]

    groups = param_groups(Own(), 0.5)
    assert len(groups) == 1 and groups[0]["weight_decay"] == 1.0


def test_optimizer_is_adamw_foreach_on_cpu_with_betas():
    opt = build_optimizer(
        _Plain(), lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95), device=torch.device("cpu")
    )
    assert isinstance(opt, torch.optim.AdamW)
    assert opt.defaults["foreach"] is True and opt.defaults["betas"] == (0.9, 0.95)
    # no decay reaches a norm gain: one step with zero gradient leaves it untouched
    m = _Plain()
    opt = build_optimizer(
        m, lr=1.0, weight_decay=0.5, betas=(0.9, 0.95), device=torch.device("cpu")
    )
    for p in m.parameters():
        p.grad = torch.zeros_like(p)
    w, g = m.lin.weight.detach().clone(), m.norm.weight.detach().clone()
    opt.step()
    assert torch.equal(m.norm.weight, g)
    assert torch.allclose(m.lin.weight, w * (1 - 0.5))


def test_grad_accum_from_tokens_per_step():
    assert grad_accum_steps(None, 8, 64, 1) == 1
    assert grad_accum_steps(8 * 64 * 4, 8, 64, 1) == 4
    assert grad_accum_steps(8 * 64 * 4, 8, 64, 2) == 2
    with pytest.raises(UserError, match=r"= 2048; use 2048 or 4096"):
        grad_accum_steps(2100, 8, 64, 4)


def test_micro_batches_of_ranks_equal_those_of_accumulation():
    import numpy as np

    offsets = np.arange(3 * 8).reshape(3, 8)
    one_proc = [micro_offsets(offsets, 1, m, 4) for m in range(2)]  # world 1, accum 2
    two_ranks = [micro_offsets(offsets, 1, r * 1 + 0, 4) for r in range(2)]  # world 2, accum 1
    assert all((a == b).all() for a, b in zip(one_proc, two_ranks))
    assert np.concatenate(one_proc).tolist() == offsets[1].tolist()


def test_peak_flops_is_measured_and_mfu_formula():
    peak = measure_peak_flops("cpu", torch.float32, n=64, iters=2)
    assert peak > 1e6
    assert mfu(100.0, 10.0, 3000.0) == pytest.approx(1.0)
    assert mfu(100.0, 10.0, 3000.0, n_devices=2) == pytest.approx(0.5)
