"""Streaming batch schedules: the same offsets, hashes and file bytes as the whole-array drawing
they replaced, memory that does not grow with the number of steps, and a refusal before drawing
a schedule the disk cannot hold."""

from __future__ import annotations

import hashlib
import io
import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from attnlab.base.errors import UserError
from attnlab.data import get_schedule
from attnlab.data.schedule import STEPS_PER_DRAW, draw_offsets, offsets_hash

#: (n_tokens, seq_len, seqs_per_step, n_steps, seed) -> sha256 of the offsets, captured from the
#: whole-array implementation before the streaming one replaced it (commit 4d5802a)
CAPTURED = {
    (50_000, 16, 3, 700, 1): "033880c26fe4773cd877f552b400d90b18769401025a3e881334b32aa49d9205",
    (1000, 32, 4, 10, 7): "393f28027599513b2ea887f4ccb1511b75b1cecb2f69432f14cbc8f6415db4c6",
    (123457, 64, 16, 2500, 0): "8b3f1aff443b68a76836ce443f96ada82b4be0c72653cedb17d6ccb3cb1aa382",
    (70, 8, 5, 3000, 12345): "360c896c00da0265dd012fe0a451bf3b76ac9e1875ca8af235837dd280d89015",
    (2**33, 1024, 2, 1025, 3): "b89aafa427c84e6826dee73857038a6f8ebddcc57ddb089aad86ac054f072e09",
}


def reference_offsets(n_tokens, seq_len, seqs, n_steps, seed) -> np.ndarray:
    """The replaced implementation, verbatim in behaviour: every block drawn, then concatenated."""
    high = n_tokens - seq_len - 1
    rng = np.random.default_rng(seed)
    blocks, drawn = [], 0
    while drawn < n_steps:
        blocks.append(
            rng.integers(0, high, size=(STEPS_PER_DRAW, seqs), dtype=np.int64, endpoint=True)
        )
        drawn += STEPS_PER_DRAW
    return np.concatenate(blocks)[:n_steps]


@pytest.mark.parametrize("args", sorted(CAPTURED))
def test_offsets_are_bit_identical_to_the_replaced_implementation(args):
    got = draw_offsets(*args)
    assert np.array_equal(got, reference_offsets(*args))
    assert offsets_hash(got) == CAPTURED[args]


@pytest.fixture()
def data_dir(hostile_lab, tmp_path) -> Path:
    import shutil

    d = tmp_path / "prepared"
    shutil.copytree(hostile_lab.data, d, ignore=shutil.ignore_patterns("schedules"))
    return d


def test_stored_schedules_match_the_replaced_files(data_dir):
    n = json.loads((data_dir / "meta.json").read_text())["splits"]["train"]["tokens"]
    for steps in (10, STEPS_PER_DRAW, 2 * STEPS_PER_DRAW + 5):
        s = get_schedule(data_dir, "train", 16, 3, steps, seed=5)
        ref = reference_offsets(n, 16, 3, steps, 5)
        buf = io.BytesIO()
        np.save(buf, ref, allow_pickle=False)  # how the replaced code wrote the file
        assert s.path.read_bytes() == buf.getvalue()
        assert (
            s.hash == offsets_hash(ref) == hashlib.sha256(ref.astype("<i8").tobytes()).hexdigest()
        )
        assert isinstance(s.offsets, np.memmap) and not s.offsets.flags.writeable
        again = get_schedule(data_dir, "train", 16, 3, steps, seed=5)  # loaded, re-hashed
        assert again.hash == s.hash and np.array_equal(again.offsets, ref)


def test_a_prefix_of_a_stored_longer_schedule_is_the_same_rows(data_dir):
    long = get_schedule(data_dir, "train", 8, 2, 3 * STEPS_PER_DRAW, seed=1)
    short = get_schedule(data_dir, "train", 8, 2, STEPS_PER_DRAW + 17, seed=1)
    assert np.array_equal(short.offsets, long.offsets[: STEPS_PER_DRAW + 17])
    assert short.hash == offsets_hash(np.asarray(long.offsets[: STEPS_PER_DRAW + 17]))


def test_memory_does_not_grow_with_the_number_of_steps(data_dir):
    steps, seqs = 400 * STEPS_PER_DRAW, 4  # 13 MB of offsets
    tracemalloc.start()
    try:
        s = get_schedule(data_dir, "train", 8, seqs, steps, seed=2)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert s.n_steps == steps and s.path.stat().st_size > 8 * seqs * steps
    assert peak < 8 * seqs * steps / 8, f"peak {peak:,} bytes: the schedule was held in memory"


def test_a_schedule_the_disk_cannot_hold_is_refused_before_drawing(data_dir):
    steps = 10**15  # 32 PB of offsets
    with pytest.raises(UserError, match=r"needs 32 PB in .*disk has .* free; lower train\.max"):
        get_schedule(data_dir, "train", 8, 4, steps, seed=0)
    assert not list((data_dir / "schedules").glob("*-N1000000000000000-*"))
