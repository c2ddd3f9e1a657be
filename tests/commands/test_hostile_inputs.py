"""``attnlab`` against a hostile user: every command line here is wrong in some way.

For each one: a non-zero exit (the documented code), no Python traceback on either stream, a
message naming the cause, and every file that existed before (the whole lab: data, runs, damaged
inputs, the directory a link points to) byte-identical afterwards, none deleted.

Most cases run in a child forked from one warm process (``tests/helpers/cli_driver.py``: the same
``attnlab.cli.main`` the console script runs, without re-importing torch each time); the cases
marked ``REAL`` run as ``python -m attnlab`` subprocesses, so the guarantee is also checked
through a real interpreter start, argv decoding and exit.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import attnlab
from tests.helpers.paths import HELPERS

SRC = str(Path(attnlab.__file__).resolve().parents[1])
HUGE = "1000000000"

#: case id -> (argv builder(lab, tmp), expected exit code, regex the stderr must match)
Case = tuple[Callable[..., list[str]], int, str]


def exp_file(L, T: Path) -> Path:
    """A small valid experiment file on the lab's data."""
    from tests.helpers.data import tiny_experiment

    tail = '[[variants]]\nname = "a"\n[[variants]]\nname = "b"\nset = ["train.lr=0.001"]\n'
    return tiny_experiment(T / "exp.toml", L.data, tail, seeds="[0]")


def first_read(L, split: str = "train") -> int:
    """The index in ``split``.bin of the first token the lab's config reads (step 1's batch, or
    the first validation batch)."""
    import numpy as np

    from attnlab.config import load_config
    from attnlab.data import get_schedule
    from attnlab.train.batches import EVAL_SEED

    cfg = load_config(L.cfg)
    t = cfg.train
    steps, seed = (t.max_steps, t.seed) if split == "train" else (t.eval_batches, EVAL_SEED)
    s = get_schedule(L.data, split, cfg.data.seq_len, t.batch_size, steps, seed)
    return int(np.asarray(s.offsets).reshape(-1)[0])


def data_copy(L, T: Path, edit: Callable[[Path], None], *, reseal: bool = False) -> str:
    """A copy of the lab's data under ``T`` changed by ``edit``; ``reseal`` rewrites meta.json's
    hashes to match (a directory whose records agree with its damaged content)."""
    from attnlab.base.atomic import sha256_file
    from attnlab.data.integrity import seal

    d = T / "data"
    shutil.copytree(L.data, d)
    edit(d)
    if reseal:
        meta = json.loads((d / "meta.json").read_text())
        for split in ("train", "val"):
            meta["splits"][split]["sha256"] = sha256_file(d / f"{split}.bin")
        meta["sha256"] = seal(meta)
        (d / "meta.json").write_text(json.dumps(meta))
    return str(d)


def put_token(split: str, index: int, value: int) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        with open(d / f"{split}.bin", "r+b") as f:
            f.seek(2 * index)
            f.write(int(value).to_bytes(2, "little"))

    return edit


def edit_meta(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        meta = json.loads((d / "meta.json").read_text())
        change(meta)
        (d / "meta.json").write_text(json.dumps(meta))

    return edit


class _Payload:
    """Unpickling this truncates the file it names: proof that a pickle was (not) loaded."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def pickled_hf_folder(T: Path) -> str:
    """A GPT-2 folder whose only weights are a pickle that would empty ``T/victim.txt``."""
    import pickle

    from tests.helpers.eval_doubles import tiny_hf_model

    d = T / "hf"
    tiny_hf_model("gpt2", max_length=64).config.save_pretrained(d)
    (T / "victim.txt").write_text("still here\n")
    (d / "pytorch_model.bin").write_bytes(pickle.dumps({"w": _Payload(T / "victim.txt")}))
    return str(d)


def _cases() -> dict[str, Case]:
    c: dict[str, Case] = {}

    def add(name: str, rc: int, pattern: str):
        def deco(build):
            assert name not in c, name
            c[name] = (build, rc, pattern)
            return build

        return deco

    # ----------------------------------------------------------------- params: config values
    for key, value, pattern in [
        ("model.n_layers", "true", r"model\.n_layers.*boolean, not a number|a boolean is not a"),
        ("train.lr", "inf", r"train\.lr.*finite"),
        ("train.lr", "-inf", r"train\.lr.*finite"),
        ("train.lr", "nan", r"train\.lr.*finite"),
        ("model.ffn.ratio", "false", r"model\.ffn\.ratio.*boolean"),
        ("train.seed", "-1", r"train\.seed.*from 0 to 4294967295"),
        ("data.split_seed", "-3", r"data\.split_seed.*from 0 to 4294967295"),
        ("model.d_model", "123456789012345678901234", r"model\.d_model.*too large.*int64"),
        ("model.d_model", "1000000000000000000", r"too large to exist.*model\.d_model"),
        ("model.vocab_size", "-5", r"model\.vocab_size"),
        ("model.n_layers", "0", r"model\.n_layers.*greater than or equal to 1"),
        ("model.ffn.ratio", "1e300", r"too large to exist: FFN hidden"),
        ("train.compile", "1", r"train\.compile.*true or false"),
    ]:
        add(f"params-{key}={value}", 2, pattern)(
            lambda L, T, kv=f"{key}={value}": ["params", "tiny", "--set", kv]
        )
    bigbird = ["model.mask.kind=bigbird", "model.mask.window=2", "model.mask.random_blocks=1"]
    add("params-bigbird-seed", 2, r"model\.mask\.random_seed.*from 0 to 4294967295")(
        lambda L, T: [
            "params",
            "tiny",
            *(a for kv in bigbird for a in ("--set", kv)),
            "--set",
            f"model.mask.random_seed={2**63 - 1}",
        ]
    )
    add("params-binary-config", 2, r"binary\.toml.*not UTF-8")(
        lambda L, T: ["params", L.f("binary.toml")]
    )
    add("params-bad-toml", 2, r"garbage\.toml.*not valid TOML")(
        lambda L, T: ["params", L.f("garbage.toml")]
    )
    add("params-deep-toml", 2, r"deep\.toml: TOML nested too deeply")(
        lambda L, T: ["params", L.f("deep.toml")]
    )
    add("params-deep-override", 2, r"override 'model\.d_model'.*nested too deeply")(
        lambda L, T: ["params", "tiny", "--set", "model.d_model=" + "[" * 5000 + "]" * 5000]
    )
    add("params-dir-as-config", 2, r"adir\.toml.*is a directory")(
        lambda L, T: ["params", L.f("adir.toml")]
    )
    add("params-unknown-preset", 2, r"unknown preset 'tinyy'.*did you mean 'tiny'")(
        lambda L, T: ["params", "tinyy"]
    )
    add("params-empty-key", 2, r"empty key part")(
        lambda L, T: ["params", "tiny", "--set", "model..x=1"]
    )
    add("params-no-equals", 2, r"dotted\.key=value")(
        lambda L, T: ["params", "tiny", "--set", "justtext"]
    )

    # ------------------------------------------------------------ train: sizes and outputs
    def train(*extra: str):
        return lambda L, T: ["train", str(L.cfg), "--out", str(T / "out"), "--quiet", *extra]

    for name, kv, pattern in [
        ("vocab", f"model.vocab_size={HUGE}", r"needs at least .*TB.*free.*model\.vocab_size"),
        ("width", "model.d_model=1000000", r"needs at least .*free.*parameters.*model\.d_model"),
        ("batch", "train.batch_size=1000000", r"needs at least .*activations.*train\.batch_size"),
        ("depth", "model.n_layers=100000000", r"needs at least .*model\.n_layers"),
        ("context", "model.max_seq_len=100000000000", r"needs at least .*parameters"),
        ("steps", "train.max_steps=10000000000", r"schedule of 10,000,000,000 steps.*disk.*free"),
        ("seed", "train.seed=-1", r"train\.seed"),
        ("lr-inf", "train.lr=inf", r"train\.lr.*finite"),
        ("bool-int", "model.n_layers=true", r"model\.n_layers.*boolean"),
        ("warmup", "train.warmup_steps=-1", r"train\.warmup_steps"),
        ("threads", "train.threads=100000", r"train\.threads 100000 must be between 1 and"),
        ("device", "train.device=nonsense", r"train\.device 'nonsense' is not a device name"),
        ("tokens-per-step", "train.tokens_per_step=7", r"tokens_per_step=7 is not a multiple"),
        ("seq-len", "data.seq_len=100000", r"data\.seq_len=100000 exceeds model\.max_seq_len"),
        ("no-data-dir", "data.dir=/nonexistent/data", r"not a prepared data directory"),
    ]:
        add(f"train-{name}", 2, pattern)(train("--set", kv))
    add("train-out-proc", 2, r"--out.*/proc.*(cannot|No such)")(
        lambda L, T: ["train", str(L.cfg), "--out", "/proc/attnlab-x", "--quiet"]
    )
    add("train-out-is-file", 2, r"--out .*cfg\.toml is a file")(
        lambda L, T: ["train", str(L.cfg), "--out", str(L.cfg), "--quiet"]
    )
    add("train-out-links-out", 2, r"linked_run/eval is a link to .*outside")(
        lambda L, T: ["train", str(L.cfg), "--out", str(L.linked_run), "--quiet"]
    )
    add("train-binary-config", 2, r"not UTF-8")(
        lambda L, T: ["train", L.f("binary.toml"), "--out", str(T / "out")]
    )
    add("train-changed-config", 2, r"train\.max_steps: 6 -> 9")(
        lambda L, T: ["train", str(L.cfg), "--out", str(L.run), "--set", "train.max_steps=9"]
    )

    # ------------------------------------------ data loss: attnlab deletes only what it wrote
    def run_copy(L, where: Path) -> str:
        where.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(L.run, where)
        return str(where)

    def user_files(d: Path, *names: str) -> Path:
        for name in names:
            (d / name).parent.mkdir(parents=True, exist_ok=True)
            (d / name).write_text(f"the user's own {name}\n")
        return d

    add("loss-export-onto-its-run", 2, r"--out .*run is the run being exported")(
        lambda L, T: ["export", run_copy(L, T / "run"), "--out", str(T / "run"), "--force"]
    )
    add("loss-export-onto-runs-folder", 2, r"--out .*runs contains the run being exported")(
        lambda L, T: [
            "export",
            (run_copy(L, T / "runs" / "sibling"), run_copy(L, T / "runs" / "ref"))[1],
            "--out",
            str(T / "runs"),
            "--force",
        ]
    )
    add("loss-export-onto-a-parent", 2, r"--out .*/a contains the run being exported")(
        lambda L, T: [
            "export",
            run_copy(L, user_files(T / "a", "mine.txt") / "b" / "run"),
            "--out",
            str(T / "a"),
            "--force",
        ]
    )
    add("loss-export-onto-user-folder", 2, r"not an export of attnlab's: it holds mine\.txt")(
        lambda L, T: [
            "export",
            str(L.run),
            "--out",
            str(user_files(T / "folder", "mine.txt")),
            "--force",
        ]
    )
    add("loss-export-dot", 2, r"--out \. contains the run being exported")(
        lambda L, T: ["export", (run_copy(L, T / "myrun"), "myrun")[1], "--out", ".", "--force"]
    )
    add("loss-export-inside-a-run", 2, r"lies inside the attnlab directory")(
        lambda L, T: ["export", str(L.run), "--out", run_copy(L, T / "r") + "/hf", "--force"]
    )
    for name in ("report.md", "results.csv"):
        add(f"loss-compare-user-{name}", 2, rf"not written by attnlab.*holds {name}")(
            lambda L, T, name=name: [
                "compare",
                str(exp_file(L, T)),
                "--out",
                str(user_files(T / "dir", name)),
                "--skip-check",
            ]
        )
    user_run = ("config.toml", "metrics.jsonl", "status.json")
    for restart in ("", "--restart"):
        add(f"loss-train-user-folder{restart}", 2, r"not written by attnlab.*config\.toml")(
            lambda L, T, r=restart: [
                "train",
                str(L.cfg),
                "--out",
                str(user_files(T / "dir", *user_run)),
                "--quiet",
                *([r] if r else []),
            ]
        )
    add("loss-train-restart-user-checkpoints", 2, r"not written by attnlab.*checkpoints")(
        lambda L, T: [
            "train",
            str(L.cfg),
            "--out",
            str(user_files(T / "dir", "checkpoints/notes.txt", "checkpoints/step_1/mine.bin")),
            "--quiet",
            "--restart",
        ]
    )
    add("loss-train-restart-run-with-user-checkpoint", 2, r"--restart would delete .*notes\.txt")(
        lambda L, T: [
            "train",
            str(L.cfg),
            "--out",
            str(user_files(Path(run_copy(L, T / "run")), "checkpoints/notes.txt")),
            "--quiet",
            "--restart",
        ]
    )

    # ------------------------------------------------- data integrity: meta.json is the truth
    def train_on(data: Callable[..., str], *extra: str, out: Callable[..., str] | None = None):
        return lambda L, T: [
            "train",
            str(L.cfg),
            "--out",
            out(L, T) if out else str(T / "out"),
            "--quiet",
            "--set",
            f"data.dir={json.dumps(data(L, T))}",
            *extra,
        ]

    def one_token_changed(L, T):
        i = first_read(L)
        old = int.from_bytes((L.data / "train.bin").read_bytes()[2 * i : 2 * i + 2], "little")
        return data_copy(L, T, put_token("train", i, (old + 1) % 256))

    add("data-shard-byte-step-1-reads", 2, r"data/train\.bin does not match the sha256")(
        train_on(one_token_changed)
    )
    add("data-shard-byte-then-restart", 2, r"data/train\.bin does not match the sha256")(
        train_on(one_token_changed, "--restart", out=lambda L, T: run_copy(L, T / "run"))
    )
    add("data-id-65535-in-train", 2, r"train\.bin holds token id 65535, outside .* 257 ids")(
        train_on(
            lambda L, T: data_copy(L, T, put_token("train", first_read(L), 65535), reseal=True)
        )
    )
    add("data-id-300-in-val", 2, r"val\.bin holds token id 300, outside .* 257 ids")(
        train_on(
            lambda L, T: data_copy(L, T, put_token("val", first_read(L, "val"), 300), reseal=True)
        )
    )
    vocab_277 = edit_meta(lambda m: m.update(vocab_size=277))
    add("data-meta-vocab-edited", 2, r"meta\.json was edited")(
        train_on(lambda L, T: data_copy(L, T, vocab_277))
    )
    add("data-meta-vocab-edited-unsealed", 2, r"vocab_size 277, but its tokenizer has 257")(
        train_on(
            lambda L, T: data_copy(
                L, T, edit_meta(lambda m: (m.pop("sha256"), m.update(vocab_size=277)))
            )
        )
    )
    add("data-info-verify-shard-byte", 2, r"data/train\.bin does not match the sha256")(
        lambda L, T: ["data", "info", one_token_changed(L, T), "--verify"]
    )
    add("data-info-verify-meta-edited", 2, r"meta\.json was edited")(
        lambda L, T: ["data", "info", data_copy(L, T, vocab_277), "--verify"]
    )

    add("train-init-from-a-pickle", 2, r"hf/pytorch_model\.bin is a pickle.*safetensors")(
        lambda L, T: [
            "train",
            str(L.cfg),
            "--out",
            str(T / "o"),
            "--init-from",
            pickled_hf_folder(T),
            "--quiet",
        ]
    )

    def linked_checkpoints(L, T) -> str:
        run = Path(run_copy(L, T / "run"))
        shutil.rmtree(run / "checkpoints")
        (run / "checkpoints").symlink_to("/etc", target_is_directory=True)
        return str(run)

    add("generate-checkpoints-link-to-etc", 2, r"run/checkpoints is a link to /etc")(
        lambda L, T: [
            "generate",
            linked_checkpoints(L, T),
            "--prompt",
            "a",
            "--max-new-tokens",
            "1",
        ]
    )
    add("export-checkpoints-link-to-etc", 2, r"run/checkpoints is a link to /etc")(
        lambda L, T: ["export", linked_checkpoints(L, T), "--out", str(T / "hf")]
    )

    def huge_value(L, T) -> str:
        path = T / "huge.toml"
        path.write_text('extends = "tiny"\n[model]\nn_layers = "' + "x" * 10_000_000 + '"\n')
        return str(path)

    add(
        "params-huge-toml-string", 2, r"'model\.n_layers' = 'x{80}\.\.\. \(10,000,000 characters\)"
    )(lambda L, T: ["params", huge_value(L, T)])

    # ---------------------------------------------------------------------------- generate
    def gen(*extra: str, run: str = "run"):
        return lambda L, T: ["generate", str(getattr(L, run)), *extra]

    add("generate-prompt-not-utf8", 2, r"--prompt is not valid UTF-8 \(byte 0xff")(
        gen("--prompt", os.fsdecode(b"abc\xff"))
    )
    add("generate-too-many-tokens", 2, r"exceeds the model's 128 learned positions; use")(
        gen("--prompt", "abc", "--max-new-tokens", "1000")
    )
    add("generate-prompt-fills-context", 2, r"shorten the prompt to at most 127 tokens")(
        gen("--prompt", "x" * 300, "--max-new-tokens", "1")
    )
    add("generate-zero-tokens", 2, r"--max-new-tokens must be at least 1")(
        gen("--prompt", "a", "--max-new-tokens", "0")
    )
    add("generate-temperature-nan", 2, r"--temperature nan must be a finite")(
        gen("--prompt", "a", "--temperature", "nan")
    )
    add("generate-temperature-inf", 2, r"--temperature inf must be a finite")(
        gen("--prompt", "a", "--temperature", "inf")
    )
    add("generate-temperature-negative", 2, r"--temperature -1\.0 must be")(
        gen("--prompt", "a", "--temperature", "-1")
    )
    add("generate-top-k-zero", 2, r"--top-k must be at least 1")(
        gen("--prompt", "a", "--top-k", "0")
    )
    add("generate-seed-negative", 2, r"--seed -1 must be between 0")(
        gen("--prompt", "a", "--seed", "-1")
    )
    add("generate-device-nonsense", 2, r"--device 'nonsense' is not a device name")(
        gen("--prompt", "a", "--device", "nonsense")
    )
    add("generate-nan-weights", 3, r"NaN/inf weights.*earlier checkpoint")(
        gen("--prompt", "a", run="nan_run")
    )
    add("generate-diverged-no-checkpoint", 3, r"diverged at step \d+ .*before its first")(
        gen("--prompt", "a", run="diverged_run")
    )
    add("generate-not-a-run", 2, r"not a run directory")(
        lambda L, T: ["generate", str(L.files), "--prompt", "a"]
    )

    # -------------------------------------------------------------------------------- eval
    def ev(*extra: str, run: str = "run"):
        return lambda L, T: ["eval", str(getattr(L, run)), "--no-progress", *extra]

    for flag, value in [
        ("--stride", "0"),
        ("--batch-size", "0"),
        ("--limit", "0"),
        ("--limit", "-1"),
        ("--max-length", "0"),
    ]:
        add(f"eval{flag}={value}", 2, rf"{flag} {value} must be at least 1")(
            ev("--tasks", "perplexity", flag, value)
        )
    add("eval-batch-too-big", 2, r"needs at least .*logits.*--batch-size")(
        ev("--tasks", "perplexity", "--batch-size", "100000000")
    )
    add("eval-nested-jsonl", 2, r"nested\.jsonl:1: JSON nested too deeply")(
        lambda L, T: ["eval", str(L.run), "--tasks", f"perplexity:{L.f('nested.jsonl')}"]
    )
    add("eval-cloze-nested", 2, r"nested\.jsonl:1: JSON nested too deeply")(
        lambda L, T: ["eval", str(L.run), "--tasks", f"cloze:{L.f('nested.jsonl')}"]
    )
    add("eval-binary-task-file", 2, r"binary\.jsonl:1: not UTF-8")(
        lambda L, T: ["eval", str(L.run), "--tasks", f"hellaswag:{L.f('binary.jsonl')}"]
    )
    add("eval-empty-task-file", 2, r"empty\.jsonl.*no items")(
        lambda L, T: ["eval", str(L.run), "--tasks", f"perplexity:{L.f('empty.jsonl')}"]
    )
    add("eval-wrong-shape-task-file", 2, r"wrong_shape\.jsonl:1: expected a JSON object")(
        lambda L, T: ["eval", str(L.run), "--tasks", f"cloze:{L.f('wrong_shape.jsonl')}"]
    )
    add("eval-out-proc", 2, r"--out /proc/attnlab-x.*cannot write in /proc")(
        ev("--tasks", "perplexity", "--out", "/proc/attnlab-x")
    )
    add("eval-out-is-dir", 2, r"--out .* is a directory")(
        lambda L, T: ["eval", str(L.run), "--tasks", "perplexity", "--out", str(L.files)]
    )
    add("eval-hf-broken-weights", 2, r"cannot load the Hugging Face model .*bad_hf")(
        lambda L, T: ["eval", f"hf:{L.bad_hf}", "--tasks", "perplexity", "--device", "cpu"]
    )
    add("eval-nan-weights", 3, r"NaN/inf weights")(ev("--tasks", "perplexity", run="nan_run"))
    add("eval-diverged-no-checkpoint", 3, r"diverged at step \d+ .*before its first")(
        ev("--tasks", "perplexity", run="diverged_run")
    )
    add("eval-writes-through-link", 2, r"eval is a link to .*outside.*Replace the link")(
        ev("--tasks", "perplexity", "--limit", "1", run="linked_run")
    )
    add("eval-unknown-task", 2, r"unknown task 'nosuchtask'")(ev("--tasks", "nosuchtask"))
    add("eval-missing-target", 2, r"does not exist")(
        lambda L, T: ["eval", str(T / "nothing"), "--tasks", "perplexity"]
    )
    add("eval-binary-target", 2, r"is not an evaluation target")(
        lambda L, T: ["eval", L.f("binary.jsonl"), "--tasks", "perplexity"]
    )
    add("eval-device-nonsense", 2, r"--device 'nonsense' is not a device name")(
        ev("--tasks", "perplexity", "--device", "nonsense")
    )
    add("eval-build-cloze-n-zero", 2, r"--n 0 must be at least 1")(
        lambda L, T: ["eval", "--build-cloze", str(L.data), "--out", str(T / "c.jsonl"), "--n", "0"]
    )
    add("eval-build-cloze-out-proc", 2, r"/proc/attnlab-x.*cannot be created")(
        lambda L, T: ["eval", "--build-cloze", str(L.data), "--out", "/proc/attnlab-x/c.jsonl"]
    )

    # -------------------------------------------------------------------------------- data
    def prep(corpus: str, *extra: str):
        return lambda L, T: [
            "data",
            "prepare",
            "--corpus",
            L.f(corpus) if "/" not in corpus else corpus,
            "--out",
            str(T / "d"),
            "--no-progress",
            *extra,
        ]

    add("data-not-gzip-jsonl", 2, r"bad\.jsonl\.gz: not a valid gzip file")(prep("bad.jsonl.gz"))
    add("data-not-gzip-txt", 2, r"bad\.txt\.gz: not a valid gzip file")(prep("bad.txt.gz"))
    add("data-truncated-gzip", 2, r"truncated\.jsonl\.gz: not a valid gzip file")(
        prep("truncated.jsonl.gz")
    )
    add("data-nested-jsonl", 2, r"nested\.jsonl:1: JSON nested too deeply")(prep("nested.jsonl"))
    add("data-binary-corpus", 2, r"binary\.jsonl: invalid UTF-8")(prep("binary.jsonl"))
    add("data-empty-corpus", 2, r"no non-empty documents")(prep("empty.jsonl"))
    add("data-one-document", 2, r"single document.*add documents")(prep("one.jsonl"))
    add("data-missing-corpus", 2, r"does not exist")(prep("/nonexistent/c.jsonl"))
    add("data-bpe-vocab-too-big", 2, r"bpe-99999999999: .*at most")(
        lambda L, T: [
            *("data", "prepare", "--corpus", str(L.root / "corpus.jsonl")),
            *("--tokenizer", "bpe-99999999999", "--out", str(T / "d"), "--no-progress"),
        ]
    )
    add("data-val-fraction-2", 2, r"val_fraction=2\.0 must be in")(
        prep("one.jsonl", "--val-fraction", "2")
    )
    add("data-val-fraction-nan", 2, r"val_fraction=nan must be in")(
        prep("one.jsonl", "--val-fraction", "nan")
    )
    add("data-max-documents-negative", 2, r"max_documents=-1 must be >= 1")(
        prep("one.jsonl", "--max-documents", "-1")
    )
    add("data-out-proc", 2, r"--out /proc/attnlab-x cannot be created")(
        lambda L, T: ["data", "prepare", "--corpus", L.f("one.jsonl"), "--out", "/proc/attnlab-x"]
    )
    add("data-info-missing", 2, r"does not exist")(
        lambda L, T: ["data", "info", str(T / "nothing")]
    )
    add("data-info-not-data", 2, r"no meta\.json")(lambda L, T: ["data", "info", str(L.files)])

    # ------------------------------------------------------------ report / compare / probe
    add("report-missing", 2, r"has no experiment\.json")(
        lambda L, T: ["report", str(T / "nothing")]
    )
    add("report-not-an-experiment", 2, r"has no experiment\.json")(
        lambda L, T: ["report", str(L.run)]
    )
    add("compare-binary", 2, r"not UTF-8")(
        lambda L, T: ["compare", L.f("binary.toml"), "--out", str(T / "c")]
    )
    add("compare-run-config", 2, r"unknown key")(
        lambda L, T: ["compare", str(L.cfg), "--out", str(T / "c")]
    )
    add("report-wrong-shape-record", 2, r"experiment\.json is valid JSON but not an experiment")(
        lambda L, T: ["report", L.f("not_a_record")]
    )
    add("compare-boolean-budget", 2, r"budget\.steps = True: a boolean is not a number")(
        lambda L, T: ["compare", L.f("exp_bool.toml"), "--out", str(T / "c"), "--plan"]
    )
    add("compare-absurd-depth", 2, r"parameters.*TB|does not fit|too large")(
        lambda L, T: ["compare", L.f("exp_deep.toml"), "--out", str(T / "c"), "--plan"]
    )
    add("params-zero-width-ffn", 2, r"model\.ffn\.ratio=0\.001 gives a hidden width of 0")(
        lambda L, T: ["params", "tiny", "--set", "model.ffn.ratio=0.001"]
    )
    add("compare-jobs-zero", 2, r"--jobs must be at least 1")(
        lambda L, T: ["compare", str(L.cfg), "--out", str(T / "c"), "--jobs", "0"]
    )
    add("probe-name-dotdot", 2, r"name '\.\.' cannot be a directory name")(
        lambda L, T: ["probe", L.f("probe_dots.toml"), "--out", str(T / "p")]
    )
    add("probe-name-escapes", 2, r"name '\.\./\.\./escape' cannot be a directory name")(
        lambda L, T: ["probe", L.f("probe_slash.toml"), "--out", str(T / "p")]
    )
    add("probe-method-dotdot", 2, r"unknown component '\.\.'")(
        lambda L, T: ["probe", "--out", str(T / "p"), "--set", "method=.."]
    )
    add("probe-binary", 2, r"not UTF-8")(
        lambda L, T: ["probe", L.f("binary.toml"), "--out", str(T / "p")]
    )

    # ------------------------------------------------------------------------------- bench
    def bench(*extra: str):
        return lambda L, T: ["bench", "tiny", "--peers", "none", "--sections", "training", *extra]

    for flag, value, low in [
        ("--batch-size", "0", 1),
        ("--seq-len", "0", 1),
        ("--steps", "0", 1),
        ("--warmup", "-1", 0),
        ("--decode-batch", "0", 1),
    ]:
        add(f"bench{flag}={value}", 2, rf"{flag} {value} must be at least {low}")(
            bench(flag, value)
        )
    add("bench-threads", 2, r"--threads 100000 must be between 1 and")(bench("--threads", "100000"))
    add("bench-batch-too-big", 2, r"needs at least .*activations")(
        bench("--batch-size", "100000000")
    )
    add("bench-width-too-big", 2, r"needs at least .*model\.d_model")(
        bench("--set", "model.d_model=1000000")
    )
    add("bench-device-nonsense", 2, r"--device 'nonsense' is not a device name")(
        bench("--device", "nonsense")
    )
    add("bench-out-proc", 2, r"/proc/attnlab-x.*cannot be created")(
        bench("--out", "/proc/attnlab-x/b")
    )

    # ---------------------------------------------------------------------------------- cli
    add("unknown-command", 2, r"invalid choice: 'nosuchcommand'")(lambda L, T: ["nosuchcommand"])
    add("no-command", 2, r"no command given")(lambda L, T: [])
    return c


CASES = _cases()
#: run as real ``python -m attnlab`` processes (one or more per command)
REAL = {
    "params-model.n_layers=true",
    "train-vocab",
    "train-steps",
    "generate-prompt-not-utf8",
    "eval-writes-through-link",
    "data-not-gzip-jsonl",
    "report-missing",
    "probe-name-dotdot",
    "bench-batch-too-big",
    "unknown-command",
}


_HASHES: dict[tuple, str] = {}


def tree_digest(root: Path) -> dict[str, str]:
    """relative path -> sha256 of every file (links: their target) under ``root``. A file whose
    inode, size, mtime and ctime are unchanged is not read again (any write moves its ctime)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            rel = str(p.relative_to(root))
            if name in (".lock", ".verified.json"):  # a lock holder's pid; a cache of hashes
                continue
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_file():
                st = p.stat()
                key = (str(p), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
                if key not in _HASHES:
                    _HASHES[key] = hashlib.sha256(p.read_bytes()).hexdigest()
                out[rel] = _HASHES[key]
    return out


class Driver:
    """The warm process of ``tests/helpers/cli_driver.py``."""

    def __init__(self) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
        self.proc = subprocess.Popen(
            [sys.executable, str(HELPERS / "cli_driver.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def run(self, argv: list[str], cwd: Path, out: Path) -> tuple[int, str, str]:
        case = {
            "argv": argv,
            "cwd": str(cwd),
            "stdout": str(out / "stdout"),
            "stderr": str(out / "stderr"),
        }
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(case) + "\n")
        self.proc.stdin.flush()
        rc = json.loads(self.proc.stdout.readline())["rc"]
        read = lambda n: (out / n).read_bytes().decode("utf-8", "replace")  # noqa: E731
        return rc, read("stdout"), read("stderr")

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def driver():
    d = Driver()
    yield d
    d.close()


def run_real(argv: list[str], cwd: Path) -> tuple[int, str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run(
        [sys.executable, "-m", "attnlab", *(os.fsencode(a) for a in argv)],
        cwd=cwd,
        capture_output=True,
        env=env,
        timeout=300,
    )
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def test_there_are_enough_cases():
    assert len(CASES) >= 60
    assert set(CASES) >= REAL and len(REAL) >= 10


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_is_refused_cleanly(name, hostile_lab, driver, tmp_path):
    build, want_rc, pattern = CASES[name]
    work = tmp_path / "work"
    work.mkdir()
    argv = build(hostile_lab, work)
    before = tree_digest(hostile_lab.root)
    before_work = tree_digest(work)  # what the case put there: the user's files
    if name in REAL:
        rc, out, err = run_real(argv, work)
    else:
        logs = tmp_path / "logs"
        logs.mkdir()
        rc, out, err = driver.run(argv, work, logs)
    shown = f"argv={argv}\nrc={rc}\nstdout:\n{out[-2000:]}\nstderr:\n{err[-3000:]}"
    assert rc == want_rc, shown
    assert "Traceback" not in err and "Traceback" not in out, shown
    assert re.search(pattern, err, re.S | re.I), shown
    after = tree_digest(hostile_lab.root)
    changed = sorted(k for k, v in before.items() if after.get(k) != v)
    assert not changed, f"pre-existing files changed or removed: {changed[:10]}\n{shown}"
    after_work = tree_digest(work)
    lost = sorted(k for k, v in before_work.items() if after_work.get(k) != v)
    assert not lost, f"the user's files changed or removed: {lost[:10]}\n{shown}"


AS_LIMIT = 6_000_000 * 1024  # `ulimit -v 6000000`, as the trial ran it


def _limit_address_space() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


@pytest.mark.parametrize(
    "command, size",
    [
        ("train", "model.vocab_size=20000000"),
        ("train", "model.score.kernel_size=1000000"),
        ("bench", "model.vocab_size=20000000"),
        ("bench", "model.score.kernel_size=1000000"),
    ],
)
def test_the_preflight_counts_the_address_space_limit(hostile_lab, tmp_path, command, size):
    """Under ``ulimit -v`` a size that free RAM would allow is refused by the preflight (exit 2,
    the limit named), not by ``RuntimeError: can't allocate memory``."""
    sets = ["--set", size]
    if "kernel_size" in size:
        sets = ["--set", "model.score.kind=virtual_heads", *sets]
    if command == "train":
        argv = ["train", str(hostile_lab.cfg), "--out", str(tmp_path / "o"), "--quiet", *sets]
    else:
        argv = ["bench", "--preset", "tiny", "--peers", "none", *sets]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run(
        [sys.executable, "-m", "attnlab", *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        preexec_fn=_limit_address_space,
    )
    assert p.returncode == 2, p.stderr[-3000:]
    assert "Traceback" not in p.stderr + p.stdout, p.stderr[-3000:]
    assert re.search(r"needs at least .* is free \(the address-space limit, ulimit -v\)", p.stderr)
    assert size in p.stderr or size.split("=")[0] in p.stderr, p.stderr
    assert not (tmp_path / "o").exists()


def test_a_huge_value_is_not_echoed_back(hostile_lab, driver, tmp_path):
    path = tmp_path / "huge.toml"
    path.write_text('extends = "tiny"\n[model]\nn_layers = "' + "x" * 10_000_000 + '"\n')
    rc, _out, err = driver.run(
        ["train", str(path), "--out", str(tmp_path / "o")], tmp_path, tmp_path
    )
    assert rc == 2 and len(err) < 2000 and "10,000,000 characters" in err, err[:3000]


def test_a_closed_output_pipe_after_a_completed_export_exits_0(hostile_lab, tmp_path):
    """`attnlab export RUN --out DIR | head -1`: the export is done, the pipe closed early."""
    read, write = os.pipe()
    os.close(read)  # nobody reads: every write to stdout fails with EPIPE
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    try:
        p = subprocess.run(
            [sys.executable, "-m", "attnlab", "export", str(hostile_lab.run), "--out", "hf"],
            cwd=tmp_path,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            timeout=300,
        )
    finally:
        os.close(write)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr and "Broken pipe" not in p.stderr, p.stderr
    assert (tmp_path / "hf" / "model.safetensors").is_file()
