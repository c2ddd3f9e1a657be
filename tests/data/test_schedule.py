"""Fixed batch schedules and ``batch_tokens``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from attnlab.base.errors import UserError
from attnlab.data import TokenData, batch_tokens, get_schedule, prepare
from attnlab.data import schedule as schedule_mod
from attnlab.data.schedule import draw_offsets, offsets_hash


@pytest.fixture()
def data_dir(tmp_path: Path) -> Path:
    docs = [f"Doc {i}. " + "lorem ipsum dolor sit amet " * (5 + i % 4) for i in range(40)]
    src = tmp_path / "d.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    prepare(str(src), "bytes", tmp_path / "data", val_fraction=0.1)
    return tmp_path / "data"


def test_schedule_is_stored_hashed_and_identical_across_calls(data_dir: Path) -> None:
    a = get_schedule(data_dir, "train", 32, 4, 10, seed=7)
    assert a.offsets.shape == (10, 4) and a.offsets.dtype == np.int64
    assert a.path == data_dir / "schedules" / "train-T32-B4-N10-S7.npy"
    record = json.loads(a.path.with_suffix(".json").read_text())
    assert record["sha256"] == a.hash == offsets_hash(a.offsets)
    b = get_schedule(data_dir, "train", 32, 4, 10, seed=7)
    assert np.array_equal(a.offsets, b.offsets) and a.hash == b.hash
    n = len(TokenData.open(data_dir).train)
    expected = np.random.default_rng(7).integers(0, n - 33, size=(1024, 4), endpoint=True)
    assert np.array_equal(a.offsets, expected[:10])  # drawn once from default_rng(seed)
    assert a.offsets.min() >= 0 and a.offsets.max() <= n - 32 - 1
    assert get_schedule(data_dir, "train", 32, 4, 10, seed=8).hash != a.hash


def test_schedule_is_prefix_stable(data_dir: Path) -> None:
    short = draw_offsets(50_000, 16, 3, 700, seed=1)
    long = draw_offsets(50_000, 16, 3, 2500, seed=1)
    assert np.array_equal(long[:700], short)
    # stored: a short one is a prefix of a longer one, whichever is made first
    s = get_schedule(data_dir, "train", 16, 3, 5, seed=0)
    m = get_schedule(data_dir, "train", 16, 3, 1500, seed=0)
    assert np.array_equal(m.offsets[:5], s.offsets)
    t = get_schedule(data_dir, "train", 16, 3, 1200, seed=0)  # taken from the stored 1500
    assert np.array_equal(t.offsets, m.offsets[:1200])


def test_extending_detects_a_changed_generator(data_dir: Path, monkeypatch) -> None:
    get_schedule(data_dir, "train", 16, 2, 4, seed=0)
    real = schedule_mod.offset_blocks
    monkeypatch.setattr(
        schedule_mod,
        "offset_blocks",
        lambda *a, **k: (b + 1 for b in real(*a, **k)),  # a "new NumPy"
    )
    with pytest.raises(UserError, match="does not extend the stored"):
        get_schedule(data_dir, "train", 16, 2, 8, seed=0)


def test_tampered_schedule_is_detected(data_dir: Path) -> None:
    sched = get_schedule(data_dir, "val", 8, 2, 3, seed=0)
    offsets = sched.offsets.copy()
    offsets[0, 0] += 1
    np.save(sched.path, offsets)
    with pytest.raises(UserError, match=r"does not match its recorded sha256.*delete"):
        get_schedule(data_dir, "val", 8, 2, 3, seed=0)
    sched.path.write_bytes(b"garbage")
    with pytest.raises(UserError, match="unreadable"):
        get_schedule(data_dir, "val", 8, 2, 3, seed=0)


def test_schedule_for_other_data_is_detected(data_dir: Path) -> None:
    sched = get_schedule(data_dir, "train", 8, 2, 3, seed=0)
    record = sched.path.with_suffix(".json")
    info = json.loads(record.read_text())
    info["content_hash"] = "0" * 64
    record.write_text(json.dumps(info))
    with pytest.raises(UserError, match="different token data"):
        get_schedule(data_dir, "train", 8, 2, 3, seed=0)


def test_split_too_short_and_bad_args(data_dir: Path) -> None:
    n_val = len(TokenData.open(data_dir).val)
    with pytest.raises(UserError, match=r"val split has \d+ tokens, too few"):
        get_schedule(data_dir, "val", n_val - 1, 1, 1, seed=0)
    get_schedule(data_dir, "val", n_val - 2, 1, 1, seed=0)  # n_tokens = T + 2 is enough
    with pytest.raises(UserError, match="unknown split"):
        get_schedule(data_dir, "test", 8, 1, 1, seed=0)
    with pytest.raises(UserError, match=">= 1"):
        get_schedule(data_dir, "train", 8, 0, 1, seed=0)
    with pytest.raises(UserError, match=r"no meta\.json"):
        get_schedule(data_dir.parent, "train", 8, 1, 1, seed=0)


@pytest.mark.fast
def test_batch_tokens_shifts_targets_by_one() -> None:
    data = np.arange(100, dtype=np.uint16)
    x, y = batch_tokens(data, np.array([[0, 10], [97 - 8, 5]]), 8)
    assert x.dtype == y.dtype == np.int64 and x.shape == y.shape == (4, 8)
    assert x[1].tolist() == list(range(10, 18)) and y[1].tolist() == list(range(11, 19))
    assert y[2, -1] == 97  # the last start whose target window fits
    with pytest.raises(UserError, match="reach past the split"):
        batch_tokens(data, np.array([92]), 8)


def test_batch_tokens_on_memmap(data_dir: Path) -> None:
    data = TokenData.open(data_dir)
    sched = get_schedule(data_dir, "train", 16, 4, 2, seed=3)
    x, y = batch_tokens(data.train, sched.offsets[1], 16)
    o = int(sched.offsets[1, 2])
    assert x[2].tolist() == np.asarray(data.train[o : o + 16]).tolist()
    assert y[2].tolist() == np.asarray(data.train[o + 1 : o + 17]).tolist()
