"""The bench runner on a micro config: every table row present with positive numbers (no timing
is asserted), result files written, the CLI wired, bad input refused with a clear message."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.bench import VARIANTS, BenchSpec, run_bench
from attnlab.bench.peers import PEERS
from attnlab.bench.report import tables, to_markdown, write_results
from attnlab.cli import main
from attnlab.config import load_config

MICRO = [
    "model.d_model=32",
    "model.n_layers=1",
    "model.attention.n_heads=2",
    "model.max_seq_len=32",
    "data.seq_len=16",
    "train.batch_size=2",
]

SETS = [a for s in MICRO for a in ("--set", s)]


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def micro_spec(**kw) -> BenchSpec:
    base = dict(
        config=load_config("tiny", MICRO),
        config_name="micro",
        steps=1,
        warmup=0,
        repeats=2,
        new_tokens=4,
        prompt_len=3,
        decode_repeats=1,
        threads=1,
        sections=("training", "inference"),
    )
    base.update(kw)
    return BenchSpec(**base)


def test_every_variant_and_peer_gets_a_row_with_positive_numbers():
    r = run_bench(micro_spec(), log=lambda _m: None)
    assert not r.skipped
    names = [row.name for row in r.training]
    assert names == [*VARIANTS, *PEERS]
    for row in r.training:
        assert row.params > 0 and row.flops_per_token > 0
        assert row.ms_per_step > 0 and row.tokens_per_s > 0
        assert row.time_ratio > 0 and row.time_ratio_best > 0 and row.mfu_measured > 0
        assert row.first_loss > 0
    assert r.row("training", "baseline").flop_ratio == 1.0
    assert [row.name for row in r.inference] == list(VARIANTS)
    for row in r.inference:
        assert row.prefill_tokens_per_s > 0
        assert row.decode_cached_tokens_per_s > 0 and row.decode_uncached_tokens_per_s > 0
        assert row.cache_speedup > 0 and row.greedy_identical
        assert row.cache_bytes_per_token > 0
    vh = r.row("training", "virtual_heads")
    assert vh.attention.startswith("O(T^2 H)") and r.row("training", "baseline").attention
    assert r.machine.peak_flops_measured > 0 and r.machine.threads == 1
    assert "virtual_heads" in to_markdown(r) and len(tables(r)) == 2


def test_cache_bytes_follow_the_kv_shape():
    r = run_bench(
        micro_spec(variants=["baseline", "preproj_skip", "moe_values"], peers=[]),
        log=lambda _m: None,
    )
    per = {row.name: row.cache_bytes_per_token for row in r.inference}
    assert per["baseline"] == 2 * 1 * 32 * 4  # K and V, one layer, d=32, float32
    assert per["preproj_skip"] == per["baseline"]  # SPEC 1.2: no cache overhead
    assert per["moe_values"] == per["baseline"]  # one layer looped once (n_layers=1)


def test_memory_is_measured_in_a_fresh_process():
    r = run_bench(
        micro_spec(variants=["virtual_heads"], peers=[], sections=("memory",)),
        log=lambda _m: None,
    )
    assert [m.name for m in r.memory] == ["virtual_heads"]
    for m in r.memory:
        assert m.error is None, m.error
        assert m.peak_rss_mib > 0 and m.growth_mib > 0


def test_results_files(tmp_path):
    r = run_bench(micro_spec(variants=["baseline"], peers=[]), log=lambda _m: None)
    md, js = write_results(r, tmp_path / "res.md")
    assert md.name == "res.md" and js.name == "res.json"
    data = json.loads(js.read_text())
    assert data["machine"]["torch_version"] == torch.__version__
    assert data["machine"]["threads"] == 1 and data["training"][0]["name"] == "baseline"
    text = md.read_text()
    assert "torch" in text and "| baseline |" in text
    assert r.machine.slug().startswith("cpu-")


def test_variant_that_cannot_apply_is_skipped_with_its_reason():
    spec = micro_spec(variants=["baseline", "identity_head"], peers=[])
    spec.config = load_config("tiny", [*MICRO, "model.residual_kind=parallel"])
    r = run_bench(spec, log=lambda _m: None)
    assert "identity_head" in r.skipped and "parallel" in r.skipped["identity_head"]
    assert [row.name for row in r.training] == ["baseline"]


def test_cli_writes_the_result(tmp_path, capsys):
    out = tmp_path / "r"
    args = ["bench", "--preset", "tiny", *SETS]
    args += ["--variants", "baseline,identity_query", "--peers", "nanogpt", "--steps", "1"]
    args += ["--repeats", "1", "--warmup", "0", "--sections", "training", "--threads", "1"]
    assert main([*args, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "identity_query" in printed and "nanogpt" in printed
    assert (tmp_path / "r.md").exists() and (tmp_path / "r.json").exists()


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--variants", "nonlinear_qurey"], ["nonlinear_query"]),
        (["--peers", "nanogtp"], ["nanogpt"]),
        (["--new-tokens", "40"], ["learned positions", "max_seq_len"]),
        (["--device", "cuda"], ["CUDA"]),
        (["--sections", "speed"], ["section"]),
    ],
)
def test_cli_refuses_bad_input_clearly(extra, words, capsys):
    args = ["bench", "--preset", "tiny", *SETS]
    if "--device" in extra and torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert main([*args, *extra]) == 2
    err = capsys.readouterr().err
    for w in words:
        assert w in err


def test_git_commit_only_from_an_attnlab_checkout(tmp_path, monkeypatch) -> None:
    """A non-editable install lives in site-packages, which can sit inside another repository
    (a pyenv checkout): its commit must not be reported as attnlab's."""
    import subprocess

    from attnlab.bench import machine

    other = tmp_path / "other"
    (other / "lib").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(other)], check=True)
    subprocess.run(
        ["git", "-C", str(other), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
         "--allow-empty", "-m", "x"],
        check=True,
    )  # fmt: skip
    monkeypatch.setattr(machine, "__file__", str(other / "lib" / "machine.py"))
    monkeypatch.chdir(other)
    assert machine._git_commit() is None
    (other / "src" / "attnlab").mkdir(parents=True)  # now it is an attnlab checkout
    head = subprocess.run(
        ["git", "-C", str(other), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    assert machine._git_commit() == head


def test_the_attention_column_names_the_path_and_the_first_step_is_apart() -> None:
    """Each variant's row says which attention path its layers ran (the baseline's plain SDPA,
    a sliding window's block-sparse SDPA; the table used to say "SDPA, O(T)" for both) and
    reports its untimed first step and the compiling inside it apart from ms/step."""
    from attnlab.bench.variants import add_variant

    window = add_variant("window:mask.kind=sliding,mask.window=4")
    r = run_bench(
        micro_spec(variants=["baseline", window], peers=[], sections=("training",)),
        log=lambda _m: None,
    )
    base, win = r.row("training", "baseline"), r.row("training", window)
    assert base.attention == "sdpa, O(T)"
    assert win.attention == "block_sparse, O(T K)"
    assert base.first_step_s > 0 and base.compile_s == 0.0  # eager: nothing compiled
    assert "first step s" in to_markdown(r) and "compile s" in to_markdown(r)
