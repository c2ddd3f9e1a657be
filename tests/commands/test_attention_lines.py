"""Each command says which attention path its model's layers run and why (issue 34): one line
per distinct (layer, path, reason) on stderr, through the commands' own entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnlab.cli import main
from attnlab.model.engine import plan

SLIDING = "attention: block_sparse (the mask is not SDPA's own at this shape"


def _config(tmp_path: Path, data_dir: Path, mask: str) -> Path:
    cfg = tmp_path / f"{mask}.toml"
    cfg.write_text(
        'extends = "tiny"\n[model]\nmax_seq_len = 32\nn_layers = 1\nd_model = 32\n'
        '[model.position]\nkind = "rope"\n'
        + ('[model.mask]\nkind = "sliding"\nwindow = 8\n' if mask == "sliding" else "")
        + f"[data]\ncorpus = {json.dumps(str(data_dir.parent / 'corpus.jsonl'))}\n"
        f"dir = {json.dumps(str(data_dir))}\nseq_len = 32\n"
        "[train]\nmax_steps = 3\nbatch_size = 2\nwarmup_steps = 1\neval_every = 3\n"
        "eval_batches = 1\ncheckpoint_every = 3\nlog_every = 1\ndevice = 'cpu'\n"
    )
    return cfg


def _stderr(capsys, monkeypatch, *args: str, code: int = 0) -> list[str]:
    """``attnlab ARGS`` in this process, as a fresh process would see the engine (nothing
    announced yet): its stderr lines."""
    monkeypatch.setattr(plan, "_announced", set())
    capsys.readouterr()
    assert main(list(args)) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return err.splitlines()


def _attention(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("attention: ")]


def test_train_eval_and_generate_say_which_path_runs_once(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """A sliding-window model: training (3 steps, one evaluation) prints the block-sparse line
    of its backward-building calls once and that of its evaluation once, beside the progress
    lines; eval past the window and generate with the cache say theirs; --quiet says none."""
    monkeypatch.chdir(tmp_path)
    cfg = _config(tmp_path, data_dir, "sliding")
    err = _stderr(capsys, monkeypatch, "train", str(cfg), "--out", "run", "--skip-check")
    lines = _attention(err)
    assert any(line.startswith("step ") for line in err)  # the progress lines beside them
    assert len(lines) == len(set(lines)) == 2, lines
    assert all(line.startswith(SLIDING) and "[mask Sliding(window=8" in line for line in lines)
    assert "(flex has no backward on CPU))" in lines[0] and "(no flex here))" in lines[1]
    err = _stderr(capsys, monkeypatch, "eval", "run", "--tasks", "perplexity", "--lengths",
                  "64", "--limit", "1", "--no-progress")  # fmt: skip
    assert _attention(err) == [lines[1]]
    err = _stderr(capsys, monkeypatch, "generate", "run", "--prompt", "the", "--max-new-tokens",
                  "20", "--temperature", "0")  # fmt: skip
    paths = [line.split(" (")[0] for line in _attention(err)]
    # the prompt (3 tokens, inside the window: is_causal), then one token at a time
    assert paths[0] == "attention: sdpa" and "attention: block_sparse" in paths
    assert len(paths) == len(set(_attention(err)))
    err = _stderr(capsys, monkeypatch, "train", str(cfg), "--out", "run2", "--skip-check",
                  "--quiet")  # fmt: skip
    assert _attention(err) == []


def test_the_baseline_says_plain_sdpa_and_bench_and_check_say_theirs(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """The baseline's call never enters the engine, and is said all the same; bench prints the
    line of each variant it times; check's battery runs every path on purpose, so it prints
    them with --verbose only."""
    monkeypatch.chdir(tmp_path)
    cfg = _config(tmp_path, data_dir, "causal")
    err = _stderr(capsys, monkeypatch, "train", str(cfg), "--out", "run", "--skip-check")
    assert _attention(err)[0] == (
        "attention: sdpa (mask is causal, nothing declared) [mask Causal(); mods []; Softmax()]"
    )
    err = _stderr(capsys, monkeypatch, "bench", "tiny", "--set", "model.mask.kind=sliding",
                  "--set", "model.mask.window=8", "--variants", "baseline", "--peers", "none",
                  "--sections", "training", "--steps", "1", "--repeats", "1", "--warmup", "0",
                  "--seq-len", "32", "--batch-size", "1", "--json")  # fmt: skip
    assert any(line.startswith(SLIDING) for line in _attention(err)), err
    check = ("check", "mask:sliding", "--no-compile", "--no-export")
    assert _attention(_stderr(capsys, monkeypatch, *check)) == []
    verbose = _attention(_stderr(capsys, monkeypatch, *check, "--verbose"))
    assert any(line.startswith(SLIDING) for line in verbose)
    assert len(verbose) == len(set(verbose))


@pytest.mark.fast
def test_a_line_is_split_at_its_layer_and_a_length_counts_once() -> None:
    """The layer is the ``[mask ...]`` that ends the engine's line, whatever brackets the reason
    holds; reasons that differ only in a number (a decoding loop's key count) print once."""
    import io
    import logging

    from attnlab.commands._attention_lines import AttentionLines

    out = io.StringIO()
    handler = AttentionLines(out)
    layer = "mask Causal(); mods [ALiBi(n_heads=4, causal=True)]; Softmax()"
    for msg in (
        f"attention path explicit: Mine rewrites the [T, T] logits [{layer}]",
        f"attention path block_sparse: too big at Tk=1500 [{layer}]",
        f"attention path block_sparse: too big at Tk=1501 [{layer}]",
        "attention engine: float32 denormals flushed to zero on CPU (flush_denormal)",
    ):
        handler.emit(logging.makeLogRecord({"msg": msg}))
    assert out.getvalue().splitlines() == [
        f"attention: explicit (Mine rewrites the [T, T] logits) [{layer}]",
        f"attention: block_sparse (too big at Tk=1500) [{layer}]",
        "attention engine: float32 denormals flushed to zero on CPU (flush_denormal)",
    ]
