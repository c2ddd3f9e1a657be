"""``attnlab train`` and ``attnlab generate`` through the CLI entry point."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from attnlab.cli import main
from attnlab.runs.rundir import read_status

WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "a",
    "mat",
    "and",
    "the",
    "dog",
    "ran",
    "to",
    "it",
    "then",
    "they",
    "slept",
    "in",
    "sun",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    rng = random.Random(1)
    path = tmp_path_factory.mktemp("corpus") / "story.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(100):
            f.write(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(60))}) + "\n")
    return path


def write_config(path: Path, corpus: Path, **train) -> Path:
    settings = {
        "max_steps": 6,
        "batch_size": 4,
        "warmup_steps": 1,
        "eval_every": 3,
        "checkpoint_every": 3,
        "eval_batches": 2,
        "threads": 1,
        **train,
    }
    lines = [
        'extends = "tiny"',
        "[data]",
        f"corpus = {json.dumps(str(corpus))}",
        "seq_len = 32",
        "val_fraction = 0.1",
        "[train]",
        *(f"{k} = {json.dumps(v)}" for k, v in settings.items()),
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus) -> Path:
    """A run trained through the CLI with data prepared into the default location."""
    import os

    root = tmp_path_factory.mktemp("cli")
    cfg = write_config(root / "exp.toml", corpus)
    old = os.getcwd()
    os.chdir(root)
    try:
        assert main(["train", str(cfg), "--out", "runs/t", "--quiet"]) == 0
    finally:
        os.chdir(old)
    return root


def test_train_prepares_default_data_dir_and_finishes(trained, capsys):
    assert (trained / "data" / "story-bytes" / "meta.json").is_file()
    status = read_status(trained / "runs" / "t")
    assert status["status"] == "finished" and status["step"] == 6
    assert status["data_dir"] == str((trained / "data" / "story-bytes").resolve())


def test_rerun_reports_finished(trained, capsys, monkeypatch):
    monkeypatch.chdir(trained)
    assert main(["train", "exp.toml", "--out", "runs/t", "--quiet"]) == 0
    assert "already finished 6 steps" in capsys.readouterr().out


def test_mismatched_config_exits_2_with_the_keys(trained, capsys, monkeypatch):
    monkeypatch.chdir(trained)
    code = main(["train", "exp.toml", "--out", "runs/t", "--set", "train.max_steps=9", "--quiet"])
    assert code == 2
    err = capsys.readouterr().err
    assert "train.max_steps: 6 -> 9" in err and "Traceback" not in err


def test_divergence_exits_3_with_a_message(trained, capsys, monkeypatch):
    monkeypatch.chdir(trained)
    args = ["--set", "train.lr=1e3", "--set", "train.min_lr=1e2", "--quiet"]
    assert main(["train", "exp.toml", "--out", "runs/div", *args]) == 3
    err = capsys.readouterr().err
    assert err.startswith("attnlab train: diverged at step") and "status.json" in err
    assert "train longer" not in err and "--restart" in err
    assert read_status(trained / "runs" / "div")["status"] == "diverged"
    # a rerun reports the recorded divergence with the same code, for schedulers that retry
    assert main(["train", "exp.toml", "--out", "runs/div", *args]) == 3


def test_progress_lines_when_not_a_terminal(tmp_path, corpus, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = write_config(tmp_path / "c.toml", corpus, max_steps=2, log_every=1)
    assert main(["train", str(cfg), "--out", "r"]) == 0
    cap = capsys.readouterr()
    assert "step       1/2  loss" in cap.err and "finished 2 steps" in cap.out


def test_generate_greedy_is_deterministic_and_cache_free_equal(trained, capsys):
    run = str(trained / "runs" / "t")
    args = ["generate", run, "--prompt", "The ", "--max-new-tokens", "12", "--temperature", "0"]
    assert main(args) == 0
    cached = capsys.readouterr().out
    assert main([*args, "--no-cache"]) == 0
    assert capsys.readouterr().out == cached
    assert cached.startswith("The ") and len(cached.rstrip("\n")) > len("The ")


def test_generate_sampling_follows_the_seed(trained, capsys):
    run = str(trained / "runs" / "t")
    base = ["generate", run, "--prompt", "the", "--max-new-tokens", "16", "--top-k", "20"]
    outs = []
    for seed in ("1", "1", "2"):
        assert main([*base, "--seed", seed]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and outs[0] != outs[2]


def test_generate_errors_are_user_errors(trained, tmp_path, capsys):
    run = str(trained / "runs" / "t")
    assert main(["generate", str(tmp_path), "--prompt", "x"]) == 2
    assert "not a run directory" in capsys.readouterr().err
    assert main(["generate", run, "--prompt", "x", "--max-new-tokens", "500"]) == 2
    assert "learned positions" in capsys.readouterr().err


def test_generate_works_after_the_data_dir_is_gone(trained, tmp_path, capsys):
    import shutil

    run = tmp_path / "moved"
    shutil.copytree(trained / "runs" / "t", run)
    text = (
        (run / "config.toml")
        .read_text()
        .replace(str((trained / "data" / "story-bytes").resolve()), str(tmp_path / "gone"))
    )
    (run / "config.toml").write_text(text)
    assert main(["generate", str(run), "--prompt", "the", "--max-new-tokens", "4"]) == 0
    assert capsys.readouterr().out.startswith("the")
