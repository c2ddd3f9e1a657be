"""BigBird's sparse pattern (Zaheer et al. 2020): window + global tokens + random key blocks,
the random blocks fixed by a stored seed, exact under the KV cache and on SDPA."""

from __future__ import annotations

import pytest
import torch

from attnlab.config import ConfigError
from attnlab.model import build_model
from attnlab.model.generate import generate
from attnlab.model.masks import allowed_keys, random_blocks
from tests.helpers.model import tiny

SETS = (
    "model.attention.mask=bigbird",
    "model.attention.window=3",
    "model.attention.n_global=1",
    "model.attention.block_size=4",
    "model.attention.random_blocks=2",
)


def test_the_pattern_is_window_global_and_random_blocks_of_earlier_keys() -> None:
    a = tiny(*SETS).attention
    pos = torch.arange(40)
    allowed = allowed_keys(a, pos, pos, causal=True)
    rand = random_blocks(a, pos, pos, causal=True)
    i, j = pos[:, None], pos[None, :]
    window = (i - j >= 0) & (i - j < 3)
    assert bool((allowed >= window).all()) and bool(allowed[:, 0].all())  # window, global 0
    assert not bool((allowed & (j > i)).any())  # causal
    for b in range(1, 10):  # query block b: exactly min(b, 2) whole random blocks before it
        rows = rand[4 * b : 4 * b + 4]
        assert torch.equal(rows, rows[:1].expand_as(rows))
        blocks = rows[0].view(10, 4)
        assert bool((blocks.all(1) | ~blocks.any(1)).all())
        assert int(blocks.all(1).sum()) == min(b, 2) and not bool(blocks[b:].any())
    assert not bool(rand[:4].any())


def test_the_random_blocks_are_fixed_by_the_stored_seed_and_independent_of_length() -> None:
    a = tiny(*SETS).attention
    other = tiny(*SETS, "model.attention.random_seed=7").attention
    pos = torch.arange(64)
    one = random_blocks(a, pos, pos, True)
    assert torch.equal(one, random_blocks(a, pos, pos, True))
    assert not torch.equal(one, random_blocks(other, pos, pos, True))
    short = torch.arange(40)
    assert torch.equal(random_blocks(a, short, short, True), one[:40, :40])
    assert tiny(*SETS).model_dump()["attention"]["random_seed"] == 0


def test_decoding_with_the_cache_equals_the_forward_and_sdpa_equals_math() -> None:
    torch.manual_seed(0)
    model = build_model(tiny(*SETS)).eval()
    prompt = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(3))
    cached = generate(model, prompt, 20, temperature=0, use_cache=True)
    assert torch.equal(cached, generate(model, prompt, 20, temperature=0, use_cache=False))
    math_model = build_model(tiny(*SETS, "model.attention.backend=math")).eval()
    math_model.load_state_dict(model.state_dict())
    x = torch.randint(0, 64, (2, 25))
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, math_model(x).logits, atol=1e-5, rtol=1e-5)


def test_bigbird_needs_a_window_and_random_blocks() -> None:
    with pytest.raises(ConfigError, match="random_blocks >= 1"):
        tiny("model.attention.mask=bigbird", "model.attention.window=3")


def test_the_check_battery_has_a_bigbird_case_whose_random_blocks_reach_beyond_local_global():
    """``attnlab check`` runs every part in a BigBird decoder (``testing/cases.py``); at its
    T=10 the random blocks add keys that local_global alone would not allow."""
    from attnlab.testing.cases import CASES, T, config_for

    case = next(c for c in CASES if c.mask == "bigbird")
    assert case.causal
    attention = config_for(case, "query", "linear", {}).model.attention
    pos = torch.arange(T)
    extra = random_blocks(attention, pos, pos, True) & ~allowed_keys(
        attention.model_copy(update={"mask": "local_global"}), pos, pos, True
    )
    assert bool((extra & (pos[None, :] <= pos[:, None])).any())
    assert not bool((allowed_keys(attention, pos, pos, True) & (pos[None, :] > pos[:, None])).any())
