"""Nothing is lost under concurrency and corruption (issue 16, "Data loss"): one writer per run and
experiment directory, checkpoints verified by sha256 with a fallback to the newest intact one, the
config carried by the checkpoint (a missing or torn config.toml is repaired, never blamed), and
wrong-shape JSON in the run's files reported with its file and line instead of a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
import tomllib
import warnings
from pathlib import Path

import pytest

from attnlab.base.errors import UserError
from attnlab.runs import checkpoint as ck
from attnlab.runs.lock import DirectoryLockedError, locked
from attnlab.runs.records import RunFileWarning
from attnlab.runs.rundir import read_metrics, read_status
from attnlab.train import train
from tests.helpers.data import run_config, tiny_run_config

STEPS = 8


def tiny(data_dir: Path, *extra: str):
    return tiny_run_config(data_dir, *extra, steps=STEPS, device="auto")


def losses(run_dir: Path) -> list[tuple[int, float, float | None]]:
    return [(r["step"], r["loss"], r.get("val_loss")) for r in read_metrics(run_dir)]


@pytest.fixture(scope="module")
def reference(data_dir, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("ref") / "run"
    assert train(tiny(data_dir), run).status == "finished"
    return run


@pytest.fixture
def stopped(data_dir, tmp_path) -> Path:
    """A run killed after step 7: checkpoints 4 and 6 on disk, metrics through step 7."""
    run = tmp_path / "run"
    train(tiny(data_dir), run, _stop_after=7)
    assert [p.name for _, p in ck.complete_checkpoints(run)] == ["step_0000006", "step_0000004"]
    return run


def _flip(path: Path, offset: int, n: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset : offset + n] = bytes(b ^ 0xFF for b in data[offset : offset + n])
    path.write_bytes(bytes(data))


# ------------------------------------------------------------------------------ locks, in-process


def test_a_locked_directory_refuses_a_second_writer_and_names_the_holder(tmp_path):
    import os

    with locked(tmp_path / "run"):
        holder = (tmp_path / "run" / ".lock").read_text()
        assert holder.startswith(f"{os.getpid()} on ")
        with locked(tmp_path / "run"):  # re-entrant in the holding process
            pass
        code = (
            "import sys; from attnlab.runs.lock import acquire\n"
            f"try:\n    acquire({str(tmp_path / 'run')!r})\n"
            "except Exception as e:\n    print(type(e).__name__, e); sys.exit(3)\n"
        )
        other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert other.returncode == 3, other.stderr
        assert "DirectoryLockedError" in other.stdout and f"process {os.getpid()}" in other.stdout
    again = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert again.returncode == 0, again.stdout  # released with the holder's last release


def test_train_refuses_a_run_directory_another_process_holds(data_dir, tmp_path):
    code = (
        "import sys, time; from attnlab.runs.lock import acquire\n"
        f"acquire({str(tmp_path / 'run')!r}); print('locked', flush=True); time.sleep(60)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(DirectoryLockedError, match=rf"in use by process {holder.pid} "):
            train(tiny(data_dir), tmp_path / "run")
        assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [".lock"]
    finally:
        holder.kill()  # SIGKILL: the kernel drops the lock, nothing stale remains
        holder.wait()
    assert train(tiny(data_dir, "train.max_steps=2"), tmp_path / "run").status == "finished"


# ------------------------------------------------------------------------- locks, real processes


def _start(cmd: list[str]) -> subprocess.Popen:
    env = {"OMP_NUM_THREADS": "1", **__import__("os").environ}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _race(first: list[str], second: list[str], offset: float) -> tuple[list, list]:
    a = _start(first)
    time.sleep(offset)
    b = _start(second)
    outs = [p.communicate(timeout=300) for p in (a, b)]
    return [a, b], outs


@pytest.mark.parametrize("offset", [0.0, 0.2, 0.5])
def test_two_train_processes_on_one_run_dir(tmp_path, data_dir, offset):
    cfg = run_config(
        tmp_path / "cfg.toml",
        data_dir.parent / "corpus.jsonl",
        data_dir,
        max_steps=12,
        batch_size=4,
        warmup_steps=2,
        log_every=1,
        eval_every=6,
        checkpoint_every=6,
        eval_batches=2,
        threads=1,
    )
    run = tmp_path / "run"
    base = [sys.executable, "-m", "attnlab", "train", str(cfg), "--out", str(run), "--quiet"]
    lrs = ["0.003", "0.01"]
    procs, outs = _race(*[[*base, "--set", f"train.lr={lr}"] for lr in lrs], offset)
    codes = [p.returncode for p in procs]
    assert sorted(codes) == [0, 2], outs
    win = codes.index(0)
    winner, loser_err = procs[win], outs[1 - win][1]
    assert f"in use by process {winner.pid} " in loser_err and "Traceback" not in loser_err
    # the surviving run's files are one run's: config.toml, checkpoint config, metrics, status
    assert tomllib.loads((run / "config.toml").read_text())["train"]["lr"] == float(lrs[win])
    _, state = ck.newest_state(run)
    assert tomllib.loads(state.config.text)["train"]["lr"] == float(lrs[win])
    assert [r["step"] for r in read_metrics(run)] == list(range(1, 13))
    status = read_status(run, strict=True)
    assert status["status"] == "finished" and status["step"] == 12


COMPARE = """
name = "race"
seeds = [0]
[base]
extends = "tiny"
[base.data]
dir = {dir}
corpus = {corpus}
seq_len = 32
[base.train]
batch_size = 4
warmup_steps = 2
eval_every = 10
eval_batches = 2
checkpoint_every = 10
log_every = 5
threads = 1
[budget]
steps = {steps}
[[variants]]
name = "baseline"
[[variants]]
name = "skip"
set = ["model.side_branch.kind=content_skip"]
"""


def _experiment(path: Path, data_dir: Path, steps: int) -> Path:
    text = COMPARE.format(
        dir=json.dumps(str(data_dir)),
        corpus=json.dumps(str(data_dir.parent / "corpus.jsonl")),
        steps=steps,
    )
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


@pytest.mark.parametrize("offset", [0.0, pytest.param(0.5, marks=pytest.mark.slow)])
def test_two_compare_processes_on_one_out_dir(tmp_path, data_dir, offset):
    exp = _experiment(tmp_path / "exp.toml", data_dir, steps=10)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "attnlab", "compare", str(exp), "--out", str(out), "--quiet"]
    procs, outs = _race(cmd, cmd, offset)
    codes = [p.returncode for p in procs]
    assert sorted(codes) == [0, 2], outs
    win = codes.index(0)
    assert f"in use by process {procs[win].pid} " in outs[1 - win][1]
    rows = json.loads((out / "results.json").read_text())["runs"]
    assert [(r["variant"], r["status"], r["steps"]) for r in rows] == [
        ("baseline", "finished", 10),
        ("skip", "finished", 10),
    ]
    for r in rows:
        assert [m["step"] for m in read_metrics(Path(r["run_dir"]))][-1] == 10


# -------------------------------------------------------------------------- hashed checkpoints


@pytest.mark.parametrize(
    ("name", "offset", "n"),
    [(ck.OPTIM_FILE, -200, 64), (ck.MODEL_FILE, -4200, 4000)],
    ids=["optimizer-64-bytes", "model-4000-bytes"],
)
def test_damaged_latest_checkpoint_falls_back_and_resumes_bit_for_bit(
    data_dir, reference, stopped, name, offset, n
):
    newest = stopped / "checkpoints" / "step_0000006"
    _flip(newest / name, (newest / name).stat().st_size + offset, n)
    with pytest.warns(ck.CheckpointWarning, match=r"step_0000006.*sha256.*step_0000004"):
        result = train(tiny(data_dir), stopped)
    assert result.status == "finished" and result.resumed_from == 4
    assert losses(stopped) == losses(reference)


def test_eval_and_generate_skip_a_damaged_checkpoint(data_dir, reference, tmp_path):
    import shutil

    from attnlab.runs.load import load_run_model

    run = tmp_path / "copy"
    shutil.copytree(reference, run)
    newest = run / "checkpoints" / "step_0000008"
    _flip(newest / ck.MODEL_FILE, (newest / ck.MODEL_FILE).stat().st_size - 600, 500)
    with pytest.warns(ck.CheckpointWarning, match="step_0000008.*falling back to step_0000006"):
        model, _, _ = load_run_model(run)
    intact = ck.read_checkpoint(run / "checkpoints" / "step_0000006", with_optim=False)
    for key, value in model.state_dict().items():
        assert (value == intact.model[key]).all(), key


# --------------------------------------------------------------------------------- config.toml


@pytest.mark.parametrize("damage", ["missing", "empty", "torn", "edited"])
def test_a_damaged_config_toml_is_repaired_from_the_checkpoint(
    data_dir, reference, stopped, damage
):
    path = stopped / "config.toml"
    original = path.read_text()
    if damage == "missing":
        path.unlink()
    elif damage == "empty":
        path.write_text("")
    elif damage == "torn":
        path.write_text(original[: len(original) // 2] + "\n[[[")
    else:
        path.write_text(original.replace("lr = 0.003", "lr = 0.5"))
    with pytest.warns(RunFileWarning, match=rf"config.toml was {damage}.*step_0000006"):
        result = train(tiny(data_dir), stopped)
    assert result.status == "finished" and result.resumed_from == 6
    assert path.read_text() == original and losses(stopped) == losses(reference)


def test_a_different_config_is_refused_even_without_config_toml(data_dir, stopped):
    (stopped / "config.toml").unlink()
    with pytest.raises(
        UserError, match=r"(?s)recorded in its checkpoint step_0000006.*train.lr: 0.003 -> 0.001"
    ):
        train(tiny(data_dir, "train.lr=1e-3"), stopped)
    assert not (stopped / "config.toml").exists()  # nothing written on refusal


def test_config_toml_is_written_atomically(data_dir, stopped, monkeypatch):
    from attnlab.base import atomic

    written = []
    real = atomic.atomic_write_bytes
    monkeypatch.setattr(
        atomic, "atomic_write_bytes", lambda p, d: (written.append(Path(p).name), real(p, d))
    )
    train(tiny(data_dir), stopped)
    assert "config.toml" in written


# ------------------------------------------------------------------------- wrong-shape JSON files


@pytest.mark.parametrize(
    "junk",
    ["[1,2,3]\n", '{"step":"abc"}\n', '"finished"\n', b"\x00\xff\xfe binary\n\x81\x82"],
    ids=["list", "step-string", "string", "binary"],
)
def test_damaged_metrics_lines_after_the_checkpoint_are_dropped_on_resume(
    data_dir, reference, stopped, junk
):
    with open(stopped / "metrics.jsonl", "ab") as f:
        f.write(junk if isinstance(junk, bytes) else junk.encode())
    with pytest.warns(RunFileWarning, match=r"metrics.jsonl line (8|9) is not a metrics row"):
        train(tiny(data_dir), stopped)  # line 9: the binary tail, cut short without a newline
    assert losses(stopped) == losses(reference)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the file is clean again
        read_metrics(stopped)


def test_a_damaged_metrics_line_before_the_checkpoint_is_named_and_dropped(
    data_dir, reference, stopped
):
    path = stopped / "metrics.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lines[2] = '{"step": "abc"}\n'
    path.write_text("".join(lines))
    with pytest.warns(RunFileWarning, match=r"line 3 is not a metrics row .*step"):
        assert [r["step"] for r in read_metrics(stopped)] == [1, 2, 4, 5, 6, 7]
    with pytest.warns(RunFileWarning, match="line 3 .* dropped .before the checkpoint at step 6"):
        train(tiny(data_dir), stopped)
    assert losses(stopped) == [x for x in losses(reference) if x[0] != 3]


@pytest.mark.parametrize("content", ['"finished"', "[1, 2]", '{"status": 5}', "\x00garbage"])
def test_a_damaged_status_json_is_rewritten_by_train(data_dir, reference, stopped, content):
    (stopped / "status.json").write_text(content)
    with pytest.warns(RunFileWarning, match=r"status.json"):
        assert read_status(stopped) is None
    with pytest.raises(UserError, match=r"status.json"):
        read_status(stopped, strict=True)
    with pytest.warns(RunFileWarning, match=r"status.json"):
        result = train(tiny(data_dir), stopped)
    assert result.status == "finished" and losses(stopped) == losses(reference)
    assert read_status(stopped, strict=True)["status"] == "finished"


def test_report_and_compare_survive_damaged_run_files(tmp_path, data_dir):
    from attnlab.experiments import build_report, load_experiment, run_all

    exp_file = _experiment(tmp_path / "exp.toml", data_dir, steps=4)
    out = tmp_path / "out"
    run_all(load_experiment(exp_file, []), out)
    base, skip = out / "runs" / "baseline" / "seed0", out / "runs" / "skip" / "seed0"
    with open(base / "metrics.jsonl", "a") as f:
        f.write("[1,2,3]\n")
    (skip / "status.json").write_text('"finished"')
    done = subprocess.run(
        [sys.executable, "-m", "attnlab", "report", str(out)], capture_output=True, text=True
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr
    assert "metrics.jsonl line" in done.stderr and "status.json" in done.stderr
    # compare repairs the run whose status is damaged (its checkpoint says it finished)
    with pytest.warns(RunFileWarning):
        outcomes = run_all(load_experiment(exp_file, []), out)
    assert [o.status for o in outcomes] == ["finished", "finished"]
    assert read_status(skip, strict=True)["status"] == "finished"
    with pytest.warns(RunFileWarning, match="metrics.jsonl line"):
        build_report(out)
