"""Checkpoint files: safetensors only, tied weights, optimizer flattening, RNG, atomicity, fallback."""

from __future__ import annotations

import json
import random

import pytest
import torch
from torch import nn

from attnlab.errors import UserError
from attnlab.train import checkpoint as ck


def _model_and_optimizer():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Embedding(12, 4), nn.LayerNorm(4), nn.Linear(4, 12, bias=False))
    m[2].weight = m[0].weight
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, foreach=True)
    m(torch.tensor([[1, 2, 3]])).logsumexp(-1).sum().backward()
    opt.step()
    return m, opt


def _save(run_dir, step, m, opt, **state):
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(m, opt)
    return ck.write_checkpoint(run_dir, step, msd, osd, {"tokens": step, **state})


def test_tied_weights_are_stored_once_and_restored_as_both_names(tmp_path):
    m, _ = _model_and_optimizer()
    ck.save_tensors(m.state_dict(), tmp_path / "m.safetensors")
    from safetensors import safe_open

    with safe_open(str(tmp_path / "m.safetensors"), "pt") as f:
        assert sorted(f.keys()) == ["0.weight", "1.bias", "1.weight"]
    loaded, _ = ck.load_tensors(tmp_path / "m.safetensors")
    assert set(loaded) == set(m.state_dict())
    assert torch.equal(loaded["2.weight"], m[0].weight)


def test_optimizer_state_round_trips_exactly():
    m, opt = _model_and_optimizer()
    from torch.distributed.checkpoint.state_dict import get_state_dict

    _, osd = get_state_dict(m, opt)
    tensors, meta = ck.flatten_optimizer(osd)
    assert "state/0.weight/exp_avg_sq" in tensors
    back = ck.unflatten_optimizer(tensors, {k: str(v) for k, v in meta.items()})
    assert back["param_groups"][0]["betas"] == (0.9, 0.999)
    for name, entry in osd["state"].items():
        for key, value in entry.items():
            assert torch.equal(back["state"][name][key], value)


def test_rng_state_round_trip():
    torch.manual_seed(3)
    random.seed(4)
    state = json.loads(json.dumps(ck.rng_state()))
    a, b = torch.rand(3), random.random()
    torch.manual_seed(99)
    random.seed(99)
    ck.set_rng_state(state)
    assert torch.equal(torch.rand(3), a) and random.random() == b


def test_write_is_atomic_keeps_two_and_points_latest(tmp_path):
    m, opt = _model_and_optimizer()
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "step_0000009.tmp").mkdir()  # a save that was killed
    for step in (1, 2, 3):
        _save(tmp_path, step, m, opt)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["latest", "step_0000002", "step_0000003"]
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step_0000003"
    got = ck.load_latest(tmp_path)
    assert got.step == 3 and got.state["tokens"] == 3
    assert set(got.state["files"]) == {ck.MODEL_FILE, ck.OPTIM_FILE}


def test_truncated_checkpoint_falls_back_with_a_warning(tmp_path):
    m, opt = _model_and_optimizer()
    _save(tmp_path, 1, m, opt)
    newest = _save(tmp_path, 2, m, opt)
    data = (newest / ck.MODEL_FILE).read_bytes()
    (newest / ck.MODEL_FILE).write_bytes(data[: len(data) // 2])
    with pytest.warns(ck.CheckpointWarning, match="step_0000002"):
        got = ck.load_latest(tmp_path)
    assert got.step == 1


def test_garbage_with_the_right_size_is_still_refused(tmp_path):
    m, opt = _model_and_optimizer()
    _save(tmp_path, 1, m, opt)
    newest = _save(tmp_path, 2, m, opt)
    size = (newest / ck.OPTIM_FILE).stat().st_size
    (newest / ck.OPTIM_FILE).write_bytes(b"\x00" * size)
    with pytest.warns(ck.CheckpointWarning, match="unreadable safetensors"):
        assert ck.load_latest(tmp_path).step == 1


def test_no_loadable_checkpoint_is_a_user_error(tmp_path):
    m, opt = _model_and_optimizer()
    path = _save(tmp_path, 1, m, opt)
    (path / ck.STATE_FILE).write_text("{not json")
    with pytest.warns(ck.CheckpointWarning), pytest.raises(UserError, match="no checkpoint"):
        ck.load_latest(tmp_path)
    assert ck.load_latest(tmp_path / "elsewhere") is None


def test_latest_pointing_at_a_missing_dir_uses_the_newest_complete(tmp_path):
    m, opt = _model_and_optimizer()
    _save(tmp_path, 4, m, opt)
    (tmp_path / "checkpoints" / "latest").write_text("step_0000099\n")
    assert ck.load_latest(tmp_path).step == 4
