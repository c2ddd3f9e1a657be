"""The training loop end to end on the tiny preset: exact resume, finished runs, config checks,
checkpoint fallback, divergence, objectives per family, and the run directory's files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from attnlab.base.errors import UserError
from attnlab.runs.checkpoint import MODEL_FILE, CheckpointWarning, complete_checkpoints
from attnlab.runs.load import load_run_model
from attnlab.runs.rundir import read_metrics, read_status
from attnlab.train import train
from tests.helpers.data import tiny_run_config


def tiny(data_dir: Path, *extra: str):
    return tiny_run_config(data_dir, *extra)


def losses(run_dir: Path) -> list[tuple[int, float, float | None]]:
    return [(r["step"], r["loss"], r.get("val_loss")) for r in read_metrics(run_dir)]


@pytest.fixture(scope="module")
def reference(data_dir, tmp_path_factory) -> Path:
    """An uninterrupted 8-step run to compare against."""
    run = tmp_path_factory.mktemp("ref") / "run"
    result = train(tiny(data_dir), run)
    assert result.status == "finished" and result.steps == 8
    return run


@pytest.mark.fast
def test_run_directory_layout_and_metrics(reference):
    status = read_status(reference)
    assert status["status"] == "finished" and status["step"] == 8
    assert len(status["schedule_hash"]) == 64 and status["tokens"] == 8 * 4 * 32
    assert status["grad_accum"] == 1 and status["objective"] == "causal_lm"
    rows = read_metrics(reference)
    assert [r["step"] for r in rows] == list(range(1, 9))
    keys = {"step", "loss", "lr", "grad_norm", "tokens", "tokens_per_s", "mfu", "elapsed"}
    assert all(keys <= set(r) for r in rows)
    assert [r["step"] for r in rows if "val_loss" in r] == [4, 8]
    assert rows[0]["lr"] == pytest.approx(3e-3 / 2) and rows[-1]["tokens"] == 1024
    assert all(r["mfu"] > 0 and r["grad_norm"] > 0 for r in rows)
    assert rows[-1]["loss"] < rows[0]["loss"]  # it learns
    assert (reference / "config.toml").is_file()
    names = sorted(p.name for p in (reference / "checkpoints").iterdir())
    assert names == ["latest", "step_0000006", "step_0000008"]


def test_stop_and_resume_is_bitwise_identical(data_dir, reference, tmp_path):
    run = tmp_path / "run"
    first = train(tiny(data_dir), run, _stop_after=5)  # checkpoint at 4; step 5 is lost
    assert first.status == "running" and read_status(run)["status"] == "running"
    assert [r["step"] for r in read_metrics(run)][-1] == 5
    second = train(tiny(data_dir), run)
    assert second.status == "finished" and second.resumed_from == 4
    assert losses(run) == losses(reference)  # exact float equality, every step
    ref_model, _, _ = load_run_model(reference)
    model, _, _ = load_run_model(run)
    for (name, a), b in zip(ref_model.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name


def test_resume_restores_the_dropout_rng(data_dir, tmp_path):
    cfg = tiny(data_dir, "model.dropout=0.2", "train.max_steps=6")
    train(cfg, tmp_path / "a")
    train(cfg, tmp_path / "b", _stop_after=3)
    train(cfg, tmp_path / "b")
    assert losses(tmp_path / "a") == losses(tmp_path / "b")


def test_gradient_noise_is_annealed_recorded_and_resumes_exactly(data_dir, reference, tmp_path):
    """Annealed gradient noise (variance eta / (1 + t)^gamma) changes the run, is recorded per
    row, and a stopped and resumed run adds exactly the noise of an uninterrupted one."""
    sets = ("train.grad_noise=0.01", "train.grad_noise_decay=0.55", "train.max_steps=6")
    cfg = tiny(data_dir, *sets)
    train(cfg, tmp_path / "a")
    train(cfg, tmp_path / "b", _stop_after=3)
    train(cfg, tmp_path / "b")
    assert losses(tmp_path / "a") == losses(tmp_path / "b")
    rows = read_metrics(tmp_path / "a")
    for r in rows:  # the row of step n logs the noise added at its update (t = n - 1)
        assert r["grad_noise_std"] == pytest.approx(math.sqrt(0.01 / r["step"] ** 0.55))
    train(tiny(data_dir, "train.max_steps=6"), tmp_path / "quiet")
    plain = losses(tmp_path / "quiet")
    assert plain[0] == losses(tmp_path / "a")[0]  # step 1's loss is read before any update
    assert all(x != y for x, y in zip(plain[1:], losses(tmp_path / "a")[1:]))
    assert "grad_noise_std" not in read_metrics(tmp_path / "quiet")[0]


def test_finished_run_is_not_retrained(data_dir, reference):
    before = (reference / "metrics.jsonl").read_text()
    again = train(tiny(data_dir), reference)
    assert again.already_done and again.status == "finished" and again.steps == 8
    assert (reference / "metrics.jsonl").read_text() == before


def test_a_different_config_is_refused_with_the_differing_keys(data_dir, reference):
    with pytest.raises(UserError, match=r"train.lr: 0.003 -> 0.001") as e:
        train(tiny(data_dir, "train.lr=1e-3"), reference)
    assert "--restart" in str(e.value)
    # eval/experiment settings do not change what is trained
    assert train(tiny(data_dir, "experiment.name='x'"), reference).already_done


def test_restart_trains_from_scratch(data_dir, reference, tmp_path):
    run = tmp_path / "run"
    train(tiny(data_dir, "train.lr=1e-3"), run, _stop_after=3)
    result = train(tiny(data_dir), run, resume=False)
    assert result.resumed_from is None and losses(run) == losses(reference)


def test_truncated_latest_checkpoint_falls_back_and_still_matches(data_dir, reference, tmp_path):
    run = tmp_path / "run"
    train(tiny(data_dir), run, _stop_after=7)  # checkpoints 4 and 6 kept
    newest = complete_checkpoints(run)[0][1]
    assert newest.name == "step_0000006"
    blob = (newest / MODEL_FILE).read_bytes()
    (newest / MODEL_FILE).write_bytes(blob[:100])
    with pytest.warns(CheckpointWarning, match="step_0000006"):
        result = train(tiny(data_dir), run)
    assert result.resumed_from == 4 and losses(run) == losses(reference)


def test_every_checkpoint_unreadable_is_a_user_error(data_dir, tmp_path):
    run = tmp_path / "run"
    train(tiny(data_dir), run, _stop_after=3)
    for _, path in complete_checkpoints(run):
        (path / MODEL_FILE).write_bytes(b"junk")
    with pytest.warns(CheckpointWarning), pytest.raises(UserError, match="no checkpoint"):
        train(tiny(data_dir), run)


def test_divergence_is_an_outcome(data_dir, tmp_path):
    run = tmp_path / "run"
    result = train(tiny(data_dir, "train.lr=1e3", "train.min_lr=1e2", "train.warmup_steps=0"), run)
    assert result.status == "diverged" and result.reason
    status = read_status(run)
    assert status["status"] == "diverged" and status["step"] == result.steps
    assert status["step"] < 8 and status["reason"] == result.reason
    last = read_metrics(run)[-1]
    assert last["diverged"] == result.reason and last["step"] == result.steps
    # a rerun reports the outcome instead of training again
    assert train(
        tiny(data_dir, "train.lr=1e3", "train.min_lr=1e2", "train.warmup_steps=0"), run
    ).already_done


def test_loss_spike_rule_stops_the_run(data_dir, tmp_path):
    # a spike factor below 1 trips as soon as a loss exceeds a fraction of the best smoothed one
    result = train(tiny(data_dir, "train.spike_factor=0.5"), tmp_path / "run")
    assert result.status == "diverged" and "spike_factor=0.5" in result.reason
    assert result.steps == 2


def test_accumulation_matches_a_bigger_micro_batch(data_dir, tmp_path):
    one = train(tiny(data_dir, "train.batch_size=8", "train.max_steps=3"), tmp_path / "a")
    two = train(
        tiny(data_dir, "train.batch_size=4", "train.tokens_per_step=256", "train.max_steps=3"),
        tmp_path / "b",
    )
    assert read_status(tmp_path / "b")["grad_accum"] == 2
    assert one.schedule_hash == two.schedule_hash
    for a, b in zip(losses(tmp_path / "a"), losses(tmp_path / "b")):
        assert a[1] == pytest.approx(b[1], rel=1e-5)


def test_validation_set_does_not_depend_on_the_training_seed(data_dir, tmp_path):
    a = train(tiny(data_dir, "train.max_steps=4"), tmp_path / "a")
    b = train(tiny(data_dir, "train.max_steps=4", "train.seed=7"), tmp_path / "b")
    sa, sb = read_status(tmp_path / "a"), read_status(tmp_path / "b")
    assert sa["val_schedule_hash"] == sb["val_schedule_hash"]
    assert a.schedule_hash != b.schedule_hash


def test_train_leaves_the_callers_rng_and_threads_alone(data_dir, tmp_path):
    torch.manual_seed(123)
    threads = torch.get_num_threads()
    expected = torch.rand(4)
    torch.manual_seed(123)
    train(tiny(data_dir, "train.max_steps=2", "train.threads=2"), tmp_path / "run")
    assert torch.equal(torch.rand(4), expected)
    assert torch.get_num_threads() == threads


def test_progress_callback_receives_events(data_dir, tmp_path):
    events = []
    train(tiny(data_dir, "train.max_steps=4"), tmp_path / "run", progress=events.append)
    kinds = [e.kind for e in events]
    assert kinds[0] == "start" and kinds[-1] == "end"
    assert [e.step for e in events if e.kind in ("step", "eval")] == [1, 2, 3, 4]
    assert events[-1].val_loss is not None and math.isfinite(events[-1].val_loss)


@pytest.mark.parametrize(
    ("family", "extra"),
    [
        ("encoder", ["model.mask.kind=full"]),
        ("encoder_decoder", ["model.n_decoder_layers=1"]),
    ],
)
def test_other_families_train_with_their_objective(data_dir, tmp_path, family, extra):
    cfg = tiny(data_dir, f"model.family={family}", *extra, "train.max_steps=4")
    result = train(cfg, tmp_path / "run")
    status = read_status(tmp_path / "run")
    assert result.status == "finished"
    assert (
        status["objective"]
        == {"encoder": "masked_lm", "encoder_decoder": "span_corruption"}[family]
    )
    rows = read_metrics(tmp_path / "run")
    assert all(math.isfinite(r["loss"]) for r in rows)
    first = train(cfg, tmp_path / "resumed", _stop_after=3)
    assert first.status == "running"
    train(cfg, tmp_path / "resumed")
    assert losses(tmp_path / "resumed") == losses(tmp_path / "run")


def test_vocab_too_small_names_both_numbers(data_dir, tmp_path):
    with pytest.raises(UserError, match=r"257 tokens = 257, but model.vocab_size=200"):
        train(tiny(data_dir, "model.vocab_size=200"), tmp_path / "run")
    with pytest.raises(UserError, match=r"\+ 1 ids for masked_lm"):
        train(
            tiny(
                data_dir,
                "model.vocab_size=257",
                "model.family=encoder",
                "model.mask.kind=full",
            ),
            tmp_path / "run",
        )
    assert not (tmp_path / "run" / "status.json").exists()


def test_missing_explicit_data_dir_is_a_user_error(data_dir, tmp_path):
    cfg = tiny(data_dir, f"data.dir={json.dumps(str(tmp_path / 'nope'))}")
    with pytest.raises(UserError, match="not a prepared data directory"):
        train(cfg, tmp_path / "run")
