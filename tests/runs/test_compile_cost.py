"""Compile cost is visible and paid once (issue 34): what compiling the attention engine's
kernels took in a session's first step is reported apart (``metrics.jsonl``: ``compile_s``,
``first_step_s``; the progress line) and kept out of tokens/s; inductor's on-disk caches sit in
one lasting directory, so a second run's first step reads the kernels instead of building them."""

from __future__ import annotations

import io
import json

import pytest

from attnlab.model.engine import compile_cost
from attnlab.runs import loop
from attnlab.runs.progress import LinePrinter
from attnlab.train import train
from tests.helpers.data import tiny_run_config


def test_the_first_steps_compile_time_is_reported_apart(data_dir, tmp_path, monkeypatch):
    """A session whose first step compiled kernels (simulated: the engine's counter grows by
    30 s during it) reports that step's compile time in its metrics row and progress line, and
    no later step does; a session that compiled nothing writes the plain rows."""
    spent = iter([0.0, 30.0] + [30.0] * 100)  # before and after each step
    monkeypatch.setattr(loop, "compile_seconds", lambda: next(spent))
    out = io.StringIO()
    train(tiny_run_config(data_dir, steps=3), tmp_path / "a", progress=LinePrinter(1, out))
    rows = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").open()]
    first = next(r for r in rows if r["step"] == 1)
    assert first["compile_s"] == 30.0 and first["first_step_s"] >= 0
    assert all("compile_s" not in r for r in rows if r["step"] > 1)
    assert (
        "first step" in out.getvalue() and "(compiling 30.0 s, kept out of tok/s)" in out.getvalue()
    )
    monkeypatch.setattr(loop, "compile_seconds", lambda: 0.0)
    train(tiny_run_config(data_dir, steps=2), tmp_path / "b")
    rows = [json.loads(line) for line in (tmp_path / "b" / "metrics.jsonl").open()]
    assert all("compile_s" not in r and "first_step_s" not in r for r in rows)


def test_first_calls_are_timed_once_per_key() -> None:
    before = compile_cost.compile_seconds()
    calls = []
    for _ in range(3):
        compile_cost.timed_first_call(("test", 1), lambda: calls.append(1))
    assert len(calls) == 3 and compile_cost.compile_seconds() >= before


@pytest.mark.fast
def test_inductors_caches_go_to_one_lasting_directory(tmp_path, monkeypatch) -> None:
    import torch._inductor.config as inductor

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(inductor, "fx_graph_cache", False)
    where = compile_cost.use_inductor_cache()
    assert where == tmp_path / "cache" / "inductor" and where.is_dir()
    assert inductor.fx_graph_cache is True
    import os

    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(where)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert compile_cost.use_inductor_cache() == tmp_path / "mine"  # the user's own wins


def test_a_second_compiled_run_reads_its_graphs_from_inductors_cache(
    data_dir, tmp_path, monkeypatch
):
    """Two runs of a tiny compiled model (train.compile) with one cache directory: the first
    compiles its graphs (misses), the second, after dynamo forgot them (a new process would
    too), reads them from disk, and its first metrics row and progress line say so."""
    import torch

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    rows, lines = [], []
    for name in ("first", "second"):
        torch._dynamo.reset()
        out = io.StringIO()
        cfg = tiny_run_config(
            data_dir, "train.compile=true", "model.n_layers=1", "model.d_model=32", steps=2,
            eval_every=2,
        )  # fmt: skip
        train(cfg, tmp_path / name, progress=LinePrinter(1, out))
        metrics = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").open()]
        rows.append(next(r for r in metrics if r["step"] == 1))
        lines.append(out.getvalue())
    first, second = rows
    assert first["fxgraph_cache_miss"] > 0 and first["compile_s"] > 0
    assert second["fxgraph_cache_hit"] > 0 and second["fxgraph_cache_miss"] == 0
    assert "inductor cache: 0 graphs read" in lines[0]
    assert f"inductor cache: {second['fxgraph_cache_hit']} graphs read, 0 compiled" in lines[1]
    assert any((tmp_path / "inductor").rglob("*")), "the graphs were written where the env says"
