"""The lm-evaluation-harness adapter: equal to lm-eval's own HFLM on the same model, consistent
with attnlab's perplexity and cloze, and usable through simple_evaluate and the CLI offline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lm_eval import simple_evaluate
from lm_eval.api.instance import Instance
from lm_eval.api.registry import get_model
from lm_eval.tasks import TaskManager

from attnlab.eval.cloze import evaluate_cloze, load_cloze_file
from attnlab.eval.harness import AttnlabEvalLM
from attnlab.eval.hf import HFCausalLM
from attnlab.eval.lm_eval_tasks import TASKS_DIR, write_task_yamls
from attnlab.eval.perplexity import document_logprobs
from tests.helpers import paths
from tests.helpers.eval_doubles import TableLM, byte_hf_tokenizer, tiny_hf_model
from tests.helpers.paths import ROOT

torch.set_num_threads(1)
FIXTURES = paths.FIXTURES / "eval"
LONG = "A text longer than the 32-token context, so rolling windows are needed here. " * 2


def _sample_count(out: dict, task: str) -> int:
    """How many documents lm-eval scored for ``task``: ``sample_len`` from 0.4.12 on; before,
    only ``n-samples`` (which lm-eval derives from the limit)."""
    results = out["results"][task]
    return results["sample_len"] if "sample_len" in results else out["n-samples"][task]["effective"]


def _inst(kind: str, args: tuple, i: int = 0) -> Instance:
    return Instance(kind, {}, args, i)


@pytest.fixture(scope="module")
def model_and_tokenizer():
    return tiny_hf_model("gpt2", max_length=32), byte_hf_tokenizer()


@pytest.fixture(scope="module")
def adapter(model_and_tokenizer):
    model, tok = model_and_tokenizer
    return AttnlabEvalLM(lm=HFCausalLM(model, tok, name="tiny"), batch_size=3)


def test_registered_as_attnlab():
    assert get_model("attnlab") is AttnlabEvalLM


def test_equal_to_lm_eval_hflm(model_and_tokenizer, adapter):
    from lm_eval.models.huggingface import HFLM

    model, tok = model_and_tokenizer
    ref = HFLM(pretrained=model, tokenizer=tok, batch_size=2, max_length=32)
    ll = [
        _inst("loglikelihood", ("Question: why?\nAnswer:", " because"), 0),
        _inst("loglikelihood", ("", "no context"), 1),
        _inst("loglikelihood", ("trailing space ", "moves"), 2),
        _inst("loglikelihood", (LONG, " end"), 3),  # context left-truncated to the window
    ]
    ours, theirs = adapter.loglikelihood(ll), ref.loglikelihood(ll)
    assert [g for _, g in ours] == [g for _, g in theirs]
    assert [v for v, _ in ours] == pytest.approx([v for v, _ in theirs], abs=1e-4)
    rolling = [_inst("loglikelihood_rolling", (LONG,), 0), _inst("loglikelihood_rolling", ("x",))]
    assert adapter.loglikelihood_rolling(rolling) == pytest.approx(
        ref.loglikelihood_rolling(rolling), abs=1e-3
    )
    gen = [_inst("generate_until", ("Hello", {"until": ["\n"], "max_gen_toks": 6}))]
    assert adapter.generate_until(gen) == ref.generate_until(gen)


def test_rolling_equals_perplexity_total_logprob(adapter):
    lm = adapter.lm
    texts = [LONG, "short one", LONG[::-1]]
    totals = document_logprobs(lm, [lm.encode(t) for t in texts], stride=lm.max_length)
    rolling = adapter.loglikelihood_rolling([_inst("loglikelihood_rolling", (t,)) for t in texts])
    assert rolling == pytest.approx(totals, abs=1e-4)


def test_generate_until_stops_at_stop_string_and_max_tokens():
    chain = {ord("a"): ord("b"), ord("b"): ord("c"), ord("c"): ord("\n"), ord("\n"): ord("a")}

    def table(prev: int) -> torch.Tensor:
        z = torch.zeros(257)
        z[chain.get(prev, ord("a"))] = 10.0
        return z

    lm = AttnlabEvalLM(lm=TableLM(table, max_length=64))
    reqs = [
        _inst("generate_until", ("x", {"until": ["\n"], "max_gen_toks": 20})),
        _inst("generate_until", ("x", {"until": ["\n"], "max_gen_toks": 2})),
        _inst("generate_until", ("x", {"until": ["c\na"], "max_gen_toks": 20})),
    ]
    assert lm.generate_until(reqs) == ["abc", "ab", "ab"]


def test_constructor_falls_back_from_missing_cuda_and_auto_batch(model_and_tokenizer, tmp_path):
    model, tok = model_and_tokenizer
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    lm = AttnlabEvalLM.create_from_arg_string(
        f"path=hf:{tmp_path},max_length=16", {"batch_size": "auto", "device": "cuda:0"}
    )
    if not torch.cuda.is_available():
        assert lm.device.type == "cpu"
    assert lm.batch_size == 8 and lm.max_length == 16
    # model_args win over the CLI's always-present --batch_size / --device values
    lm = AttnlabEvalLM.create_from_arg_string(
        f"path=hf:{tmp_path},batch_size=3,device=cpu", {"batch_size": 1, "device": "cuda:0"}
    )
    assert lm.batch_size == 3 and lm.device.type == "cpu"


def test_simple_evaluate_by_name_matches_attnlab_cloze(model_and_tokenizer, tmp_path):
    model, tok = model_and_tokenizer
    model_dir = tmp_path / "model"
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    lm = HFCausalLM(model, tok)
    ours = evaluate_cloze(lm, load_cloze_file(FIXTURES / "lambada.jsonl")).metrics()
    tasks = write_task_yamls(tmp_path / "tasks", cloze=FIXTURES / "lambada.jsonl")
    out = simple_evaluate(
        model="attnlab",
        model_args=f"path=hf:{model_dir},batch_size=2",
        tasks=["attnlab_cloze_local"],
        task_manager=TaskManager(include_path=str(tasks), include_defaults=False),
        bootstrap_iters=0,
        verbosity="ERROR",
    )
    res = out["results"]["attnlab_cloze_local"]
    assert res["acc,none"] == pytest.approx(ours["acc"])
    assert res["perplexity,none"] == pytest.approx(ours["perplexity"], rel=1e-4)


def test_shipped_task_yamls_run_from_the_repo_root(adapter):
    repo = ROOT
    cwd = Path.cwd()
    os.chdir(repo)  # the shipped YAMLs read fixture paths relative to the repository root
    try:
        out = simple_evaluate(
            model=adapter,
            tasks=["attnlab_arc_local", "attnlab_text_local"],
            task_manager=TaskManager(include_path=str(TASKS_DIR), include_defaults=False),
            limit=2,
            bootstrap_iters=0,
            verbosity="ERROR",
        )
    finally:
        os.chdir(cwd)
    assert len(out["samples"]["attnlab_arc_local"]) == 2  # one logged sample per document
    assert out["results"]["attnlab_text_local"]["bits_per_byte,none"] > 0


@pytest.mark.slow  # the stock CLI indexes all of lm-eval's built-in tasks (~15-70 s)
def test_lm_eval_cli_finds_the_attnlab_model(model_and_tokenizer, tmp_path):
    model, tok = model_and_tokenizer
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    tasks = write_task_yamls(tmp_path / "tasks", arc=FIXTURES / "arc.jsonl")
    cmd = [
        sys.executable, "-m", "attnlab.eval.lm_eval_cli",
        "--model", "attnlab", "--model_args", f"path=hf:{tmp_path / 'model'}",
        "--tasks", "attnlab_arc_local", "--include_path", str(tasks),
        "--limit", "3", "--output_path", str(tmp_path / "out"), "--device", "cpu",
    ]  # fmt: skip
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = list((tmp_path / "out").rglob("results_*.json"))
    assert len(results) == 1
    data = json.loads(results[0].read_text())
    assert _sample_count(data, "attnlab_arc_local") == 3


def test_registering_attnlab_keeps_lm_eval_models():
    assert get_model("hf").__name__ == "HFLM"
