"""A directory of things a hostile user hands attnlab: a trained run, a run with NaN weights, a run
that diverged before its first checkpoint, a run whose ``eval/`` links out of it, damaged files,
a Hugging Face directory with broken weights, and experiment/probe files with bad names.

Built once per test session (``hostile_lab`` in conftest.py) and never written by the tests that
use it: a test that must write copies what it needs.
"""

from __future__ import annotations

import gzip
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.data import run_config, sentence_data


@dataclass(frozen=True)
class Lab:
    root: Path
    data: Path
    cfg: Path
    run: Path
    nan_run: Path
    diverged_run: Path
    linked_run: Path
    outside: Path
    bad_hf: Path
    files: Path

    def f(self, name: str) -> str:
        return str(self.files / name)


def _train(cfg_path: Path, out: Path, overrides: tuple[str, ...] = ()):
    from attnlab.config import load_config
    from attnlab.train import train

    return train(load_config(cfg_path, overrides), out)


def _nan_checkpoint(run: Path) -> None:
    """A newest checkpoint whose weights are all NaN, written by the checkpoint writer itself."""
    import torch

    from attnlab.runs.checkpoint import load_latest, write_checkpoint

    ck = load_latest(run)
    assert ck is not None
    weights = {k: torch.full_like(v, float("nan")) for k, v in ck.model.items()}
    skip = ("format", "step", "files", "config", "sha256")
    state = {k: v for k, v in ck.state.model_dump(mode="json").items() if k not in skip}
    write_checkpoint(run, ck.step + 1, weights, ck.optim, state, config=ck.state.config)


def _bad_hf_dir(path: Path) -> None:
    """config.json and a working tokenizer, but weights transformers cannot read."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    path.mkdir()
    vocab = {w: i for i, w in enumerate(["<unk>", "<eos>", "a", "b", "c"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<eos>"})
    )
    config = {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": 5,
        "n_positions": 16,
        "n_embd": 8,
        "n_layer": 1,
        "n_head": 2,
    }
    (path / "config.json").write_text(json.dumps(config))
    (path / "model.safetensors").write_bytes(b"\xff" * 4000)


def _files(d: Path) -> None:
    d.mkdir()
    (d / "bad.jsonl.gz").write_bytes(b'{"text": "not gzip at all"}\n')
    (d / "bad.txt.gz").write_bytes(b"plain text with a .gz name")
    (d / "truncated.jsonl.gz").write_bytes(gzip.compress(b'{"text": "a"}\n' * 200)[:40])
    (d / "nested.jsonl").write_text("[" * 100_000 + "]" * 100_000 + "\n")
    binary = b"\x89PNG\r\n\x1a\n" + bytes(range(128, 256)) * 24  # not UTF-8 at byte 0
    (d / "binary.jsonl").write_bytes(binary)
    (d / "binary.toml").write_bytes(binary)
    (d / "empty.jsonl").write_bytes(b"")
    (d / "one.jsonl").write_text(json.dumps({"text": "one lonely document " * 20}) + "\n")
    (d / "garbage.toml").write_text("[[[\n")
    (d / "deep.toml").write_text("a = " + "[" * 100_000 + "]" * 100_000 + "\n")
    (d / "adir.toml").mkdir()
    (d / "wrong_shape.jsonl").write_text("[1, 2, 3]\n")
    (d / "exp_bool.toml").write_text(
        '[base]\nextends = "tiny"\n[budget]\nsteps = true\n[[variants]]\nname = "a"\n'
    )
    (d / "exp_deep.toml").write_text(
        '[base]\nextends = "tiny"\n[base.model]\nn_layers = 100000000\n[base.train]\nwarmup_steps = 1\n'
        '[budget]\nsteps = 2\n[[variants]]\nname = "a"\n'
    )
    (d / "not_a_record").mkdir()
    (d / "not_a_record" / "experiment.json").write_text('"a string, not a record"\n')
    (d / "probe_dots.toml").write_text(
        'name = "dots"\nmethods = [{method = "frozen", name = ".."}]\n'
    )
    (d / "probe_slash.toml").write_text(
        'name = "slash"\nmethods = [{method = "frozen", name = "../../escape"}]\n'
    )


def build_lab(root: Path) -> Lab:
    """Everything above under ``root``; takes a few seconds (two 6-step tiny trainings)."""
    data = sentence_data(root)
    cfg = run_config(
        root / "cfg.toml",
        root / "corpus.jsonl",
        data,
        seq_len=32,
        max_steps=6,
        batch_size=4,
        warmup_steps=1,
        eval_every=3,
        eval_batches=2,
        checkpoint_every=3,
        log_every=2,
    )
    run = root / "run"
    assert _train(cfg, run).status == "finished"
    nan_run = root / "nan_run"
    shutil.copytree(run, nan_run)
    _nan_checkpoint(nan_run)
    diverged = root / "diverged_run"
    result = _train(
        cfg, diverged, ("train.lr=1e3", "train.min_lr=1e2", "train.checkpoint_every=100")
    )
    assert result.status == "diverged", result
    outside = root / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("a file outside every run\n")
    linked = root / "linked_run"
    shutil.copytree(run, linked)
    (linked / "eval").symlink_to(outside, target_is_directory=True)
    bad_hf = root / "bad_hf"
    _bad_hf_dir(bad_hf)
    files = root / "files"
    _files(files)
    return Lab(root, data, cfg, run, nan_run, diverged, linked, outside, bad_hf, files)
