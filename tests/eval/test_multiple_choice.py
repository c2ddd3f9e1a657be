"""Multiple choice: acc / acc_norm on hand-computed log-likelihoods, the HellaSwag and ARC
formats, and per-item agreement with lm-evaluation-harness on the same model and items."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.base.errors import UserError
from attnlab.eval.hf import HFCausalLM
from attnlab.eval.multiple_choice import (
    MCItem,
    arc_item,
    evaluate_multiple_choice,
    hellaswag_item,
    load_mc_file,
)
from tests.helpers import paths
from tests.helpers.eval_doubles import TableLM, byte_hf_tokenizer, tiny_hf_model

torch.set_num_threads(1)
FIXTURES = paths.FIXTURES / "eval"


def test_acc_and_acc_norm_on_a_uniform_model():
    # every byte costs ln 257: ll_j = -(len(choice) + 1) ln 257 (the +1 is the leading space)
    lm = TableLM(lambda prev: torch.zeros(257), max_length=64)
    item = MCItem("Pick:", ["ab", "abcdefgh", "abcd"], gold=1)
    res = evaluate_multiple_choice(lm, [item])
    ln = math.log(257)
    assert res.logprobs[0] == pytest.approx([-3 * ln, -9 * ln, -5 * ln], rel=1e-5)
    # acc takes the shortest choice (0); acc_norm ll/len = -(1 + 1/len) ln 257 takes the longest
    assert res.predictions() == [(0, 1)]
    m = res.metrics()
    assert (m["acc"], m["acc_norm"], m["n"]) == (0.0, 1.0, 1)


@pytest.mark.fast
def test_acc_counts_the_gold_choice_of_a_rigged_model():
    def table(prev: int) -> torch.Tensor:  # after ":" and " " prefer "y"; elsewhere uniform
        z = torch.zeros(257)
        if prev in (ord(":"), ord(" ")):
            z[ord("y")] = 20.0
        return z

    lm = TableLM(table, max_length=64)
    items = [MCItem("Q:", ["no", "yes"], gold=1), MCItem("Q:", ["yes", "no"], gold=1)]
    res = evaluate_multiple_choice(lm, items, batch_size=3)
    assert [p for p, _ in res.predictions()] == [1, 0]
    assert res.metrics()["acc"] == 0.5
    assert res.metrics()["acc_stderr"] == pytest.approx(0.5)  # sqrt(var_ddof1 / n)


def test_hellaswag_preprocessing_matches_lm_eval():
    from lm_eval.tasks.hellaswag.utils import preprocess

    rows = load_mc_file("hellaswag", FIXTURES / "hellaswag.jsonl")
    assert len(rows) == 6
    wikihow = rows[2]
    assert wikihow.context == (
        "Home and Garden: How to water a cactus. Check the soil before watering. Push a "
        "finger into the soil up to the first knuckle."
    )
    assert (
        wikihow.choices[0]
        == " If the soil is dry, water the cactus until water drains from the pot."
    )
    raw = {
        "activity_label": "X",
        "ctx_a": "a [title] b",
        "ctx_b": "c",
        "endings": ["[x] d"],
        "label": 0,
    }
    item = hellaswag_item(raw)
    assert item.context == preprocess("X: a [title] b C") and item.choices == [preprocess("[x] d")]
    assert hellaswag_item({"ctx": "plain", "endings": ["e"], "label": "0"}).context == "plain"


def test_arc_format_and_labels():
    items = load_mc_file("arc", FIXTURES / "arc.jsonl")
    assert (
        items[0].context
        == "Question: Which gas do plants take in from the air to make food?\nAnswer:"
    )
    assert items[0].gold == 1 and items[3].gold == 1  # answerKey "B" and numeric "2"
    assert len(items[2].choices) == 3
    with pytest.raises(UserError, match="answerKey"):
        arc_item({"question": "q", "choices": {"text": ["a"], "label": ["A"]}, "answerKey": "Z"})


def test_bad_rows_name_file_and_line(tmp_path):
    bad = tmp_path / "hs.jsonl"
    bad.write_text('{"ctx": "a", "endings": ["x", "y"], "label": 5}\n')
    with pytest.raises(
        UserError, match=r"hs.jsonl:1: item 0 \(0-based\): field 'label' = 5 is out of range"
    ):
        load_mc_file("hellaswag", bad)


@pytest.fixture(scope="module")
def tiny_lm():
    return HFCausalLM(tiny_hf_model("llama", max_length=256), byte_hf_tokenizer(), name="tiny")


@pytest.mark.parametrize(("fmt", "task"), [("hellaswag", "hellaswag"), ("arc", "arc")])
def test_per_item_scores_equal_lm_eval(tmp_path, tiny_lm, fmt, task):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from attnlab.eval.harness import AttnlabEvalLM
    from attnlab.eval.lm_eval_tasks import write_task_yamls

    path = FIXTURES / f"{fmt}.jsonl"
    ours = evaluate_multiple_choice(tiny_lm, load_mc_file(fmt, path), batch_size=4)
    tasks_dir = write_task_yamls(tmp_path, **{task: path})
    out = simple_evaluate(
        model=AttnlabEvalLM(lm=tiny_lm, batch_size=4),
        tasks=[f"attnlab_{task}_local"],
        task_manager=TaskManager(include_path=str(tasks_dir), include_defaults=False),
        log_samples=True,
        bootstrap_iters=0,
        verbosity="ERROR",
    )
    samples = sorted(out["samples"][f"attnlab_{task}_local"], key=lambda s: s["doc_id"])
    assert len(samples) == len(ours.items)
    for s, lls, row in zip(samples, ours.logprobs, ours.per_item()):
        assert [r[0][0] for r in s["resps"]] == pytest.approx(lls, abs=1e-4)
        assert (s["acc"], s["acc_norm"]) == (row["acc"], row["acc_norm"])
    res = out["results"][f"attnlab_{task}_local"]
    m = ours.metrics()
    assert res["acc,none"] == pytest.approx(m["acc"])
    assert res["acc_norm,none"] == pytest.approx(m["acc_norm"])
