"""Shared test data: small word-salad corpora, prepared as byte-level data, and run configs."""

from __future__ import annotations

import json
import random
import textwrap
from pathlib import Path

#: the vocabulary of the word-salad corpora of the training and comparison tests
WORDS = [
    *("the", "a", "model", "attention", "head", "query", "key", "value", "layer", "token"),
    *("sequence", "learns", "predicts", "of", "to", "and", "in", "is", "was", "by", "with"),
    *("from", "small", "large", "fast", "slow", "train", "data", "loss", "step"),
]


def word_corpus(
    path: Path,
    words: list[str],
    *,
    n_docs: int,
    length: int | tuple[int, int],
    seed: int,
    sentence: bool = False,
) -> Path:
    """JSONL, one document per line: ``length`` words drawn from ``words`` (a (lo, hi) range is
    drawn per document); ``sentence`` capitalises it and ends it with a full stop."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n_docs):
            n = rng.randint(*length) if isinstance(length, tuple) else length
            text = " ".join(rng.choice(words) for _ in range(n))
            f.write(json.dumps({"text": text.capitalize() + "." if sentence else text}) + "\n")
    return path


def prepare_bytes(corpus: Path, out: Path, val_fraction: float = 0.1) -> Path:
    from attnlab.data import prepare

    prepare(str(corpus), "bytes", out, val_fraction=val_fraction, progress=False)
    return out


def run_config(path: Path, corpus: Path, data_dir: Path, *, seq_len: int = 32, **train) -> Path:
    """A TOML run config extending ``tiny`` on the prepared data, with ``[train]`` settings.
    The device is CPU unless ``device=`` says otherwise: the tests using it compare runs for
    equality, which CPU kernels give on any machine (the GPU versions are in test_gpu_*.py)."""
    train.setdefault("device", "cpu")
    lines = [
        'extends = "tiny"',
        "[data]",
        f"corpus = {json.dumps(str(corpus))}",
        f"dir = {json.dumps(str(data_dir))}",
        f"seq_len = {seq_len}",
        "[train]",
        *(f"{k} = {json.dumps(v)}" for k, v in train.items()),
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def sentence_data(root: Path) -> Path:
    """``root/corpus.jsonl`` (120 sentences of 40-90 WORDS) prepared as bytes in ``root/prepared``."""
    corpus = word_corpus(
        root / "corpus.jsonl", WORDS, n_docs=120, length=(40, 90), seed=0, sentence=True
    )
    return prepare_bytes(corpus, root / "prepared")


def tiny_run_config(
    data_dir: Path, *extra: str, steps: int = 8, eval_every: int = 4, device: str = "cpu"
):
    """The ``tiny`` preset on ``sentence_data``'s prepared ``data_dir``: T=32, B=4, ``steps``
    steps (2 of warm-up), a log line every step, an evaluation of 2 batches every
    ``eval_every`` steps, a checkpoint every 2, one thread, then the ``extra`` overrides. CPU by
    default: the tests using it compare runs for equality (GPU twins: test_gpu_*.py)."""
    from attnlab.config import load_config

    return load_config(
        "tiny",
        [
            f"data.dir={json.dumps(str(data_dir))}",
            f"data.corpus={json.dumps(str(data_dir.parent / 'corpus.jsonl'))}",
            "data.seq_len=32",
            "train.batch_size=4",
            f"train.max_steps={steps}",
            "train.warmup_steps=2",
            "train.log_every=1",
            f"train.eval_every={eval_every}",
            "train.checkpoint_every=2",
            "train.eval_batches=2",
            "train.threads=1",
            f"train.device={device}",
            *extra,
        ],
    )


def tiny_experiment(
    path: Path, data_dir: Path, tail: str, *, name: str = "e2e", seeds: str = "[0, 1]", **train
) -> Path:
    """An experiment TOML at ``path``: base ``tiny`` on ``sentence_data``'s ``data_dir`` (T=32,
    B=4, one thread, validation every 5 steps), a budget of 10 steps, ``[base.train]`` settings
    ``train`` on top, then ``tail`` (``[[variants]]``, ``[sweep]``, ``[evaluate]`` tables)."""
    settings = {
        "batch_size": 4,
        "warmup_steps": 2,
        "eval_every": 5,
        "eval_batches": 2,
        "checkpoint_every": 5,
        "log_every": 5,
        "threads": 1,
        **train,
    }
    lines = [
        f"name = {json.dumps(name)}",
        f"description = {json.dumps('A tiny experiment of the test suite.')}",
        f"seeds = {seeds}",
        "[base]",
        'extends = "tiny"',
        "[base.data]",
        f"dir = {json.dumps(str(data_dir))}",
        f"corpus = {json.dumps(str(data_dir.parent / 'corpus.jsonl'))}",
        "seq_len = 32",
        "[base.train]",
        *(f"{k} = {json.dumps(v)}" for k, v in settings.items()),
        "[budget]",
        "steps = 10",
    ]
    path.write_text("\n".join(lines) + "\n" + textwrap.dedent(tail), encoding="utf-8")
    return path
