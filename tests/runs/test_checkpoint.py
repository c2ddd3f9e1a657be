"""Checkpoint files: safetensors only, tied weights, optimizer flattening, RNG, atomicity, content
hashes and the fallback to the newest intact checkpoint."""

from __future__ import annotations

import json
import random

import pytest
import torch
from torch import nn

from attnlab.base.errors import UserError
from attnlab.runs import checkpoint as ck
from attnlab.runs.rng import rng_state, set_rng_state


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


@pytest.mark.fast
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
    state = json.loads(json.dumps(rng_state()))
    a, b = torch.rand(3), random.random()
    torch.manual_seed(99)
    random.seed(99)
    set_rng_state(state)
    assert torch.equal(torch.rand(3), a) and random.random() == b


@pytest.mark.fast
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
    assert got.step == 3 and got.state.tokens == 3
    assert set(got.state.files) == {ck.MODEL_FILE, ck.OPTIM_FILE}


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
    with pytest.warns(ck.CheckpointWarning, match="sha256"):
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


def _flip(path, offset: int, n: int = 64) -> None:
    data = bytearray(path.read_bytes())
    for i in range(offset, min(offset + n, len(data))):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name", [ck.MODEL_FILE, ck.OPTIM_FILE])
def test_flipped_bytes_are_found_by_the_hash_and_the_previous_checkpoint_is_used(tmp_path, name):
    m, opt = _model_and_optimizer()
    _save(tmp_path, 1, m, opt)
    newest = _save(tmp_path, 2, m, opt)
    size = (newest / name).stat().st_size
    _flip(newest / name, size - 80)  # inside the tensor data: safetensors still parses it
    with pytest.warns(
        ck.CheckpointWarning, match=r"step_0000002.*sha256.*falling back to step_0000001"
    ):
        assert ck.load_latest(tmp_path).step == 1


def test_only_the_files_loaded_are_verified(tmp_path):
    m, opt = _model_and_optimizer()
    _save(tmp_path, 1, m, opt)
    newest = _save(tmp_path, 2, m, opt)
    _flip(newest / ck.OPTIM_FILE, 200)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # eval/generate read weights only: no fallback needed
        assert ck.load_latest(tmp_path, with_optim=False).step == 2
    with pytest.warns(ck.CheckpointWarning):
        assert ck.load_latest(tmp_path).step == 1


@pytest.mark.parametrize(
    "content",
    [
        "[1, 2, 3]",
        '{"step": "abc"}',
        None,  # a number edited inside otherwise valid state.json: its own sha256 catches it
        "\x00\xff garbage",
    ],
)
def test_a_wrong_or_edited_state_json_is_skipped(tmp_path, content):
    m, opt = _model_and_optimizer()
    _save(tmp_path, 1, m, opt)
    newest = _save(tmp_path, 2, m, opt)
    state_file = newest / ck.STATE_FILE
    if content is None:
        raw = json.loads(state_file.read_text())
        raw["tokens"] += 1
        content = json.dumps(raw)
    state_file.write_text(content, encoding="utf-8", errors="surrogateescape")
    with pytest.warns(ck.CheckpointWarning, match="step_0000002"):
        got = ck.load_latest(tmp_path)
    assert got.step == 1 and got.state.tokens == 1


def test_the_training_config_travels_with_the_checkpoint(tmp_path):
    from attnlab.runs.records import ConfigRecord

    m, opt = _model_and_optimizer()
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(m, opt)
    record = ConfigRecord(file="config.toml", text='[train]\nlr = 0.5\nloss = "nan"\n')
    ck.write_checkpoint(tmp_path, 3, msd, osd, {"last_loss": float("nan")}, config=record)
    path, state = ck.newest_state(tmp_path)
    assert path.name == "step_0000003" and state.config == record
    raw = json.loads((path / ck.STATE_FILE).read_text())  # strict JSON: NaN written as null
    assert raw["last_loss"] is None and raw["format"] == 2
    assert len(raw["files"][ck.MODEL_FILE]["sha256"]) == 64


def test_a_failed_write_keeps_the_earlier_checkpoints(tmp_path, monkeypatch):
    import errno

    m, opt = _model_and_optimizer()
    _save(tmp_path, 1, m, opt)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ck, "save_file", full)
    with pytest.raises(UserError, match=r"step_0000002.*No space left.*earlier checkpoints"):
        _save(tmp_path, 2, m, opt)
    monkeypatch.undo()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "latest",
        "step_0000001",
    ]
    assert ck.load_latest(tmp_path).step == 1
