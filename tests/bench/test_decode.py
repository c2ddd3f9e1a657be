"""Greedy decoding with the KV cache equals recomputation for every variant; a wrong cache is
caught by the benchmark, not timed."""

from __future__ import annotations

import pytest
import torch

from attnlab.bench.inference import GreedyMismatchError, check_greedy
from attnlab.bench.variants import VARIANTS, variant_config
from attnlab.config import load_config
from attnlab.model import build_model
from attnlab.model.kv_cache import KVCache


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _model(name: str):
    base = load_config("tiny", ["model.d_model=32", "model.attention.n_heads=2"])
    torch.manual_seed(0)
    return build_model(variant_config(base, name).model)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_cached_and_uncached_greedy_tokens_are_identical(name):
    prompt = torch.randint(0, 288, (2, 5), generator=torch.Generator().manual_seed(0))
    cached, plain = check_greedy(_model(name), prompt, 12)
    assert cached.shape == (2, 17) and torch.equal(cached, plain)


def test_a_broken_cache_is_reported(monkeypatch):
    real = KVCache.update

    def corrupt(self, slot, k, v, start):
        keys, values = real(self, slot, k, v, start)
        if start == 0:
            return keys, values
        # a stale cache: every earlier value replaced by noise (large, so it moves the argmax)
        noise = torch.randn(values.shape, generator=torch.Generator().manual_seed(start))
        return keys, torch.cat([10 * noise[:, :, :-1], values[:, :, -1:]], dim=2)

    monkeypatch.setattr(KVCache, "update", corrupt)
    prompt = torch.randint(0, 288, (1, 5), generator=torch.Generator().manual_seed(0))
    with pytest.raises(GreedyMismatchError, match="differs from recomputation"):
        check_greedy(_model("baseline"), prompt, 16)
