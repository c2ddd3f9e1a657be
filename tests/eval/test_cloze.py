"""Cloze: LAMBADA splitting, greedy multi-token exact match, target log-likelihood, the builder."""

from __future__ import annotations

import json
import math

import pytest
import torch

from attnlab.base.errors import UserError
from attnlab.eval.cloze import cloze_item, evaluate_cloze, load_cloze_file
from attnlab.eval.cloze_build import STOP_WORDS, build_cloze_set, passages_of, split_sentences
from attnlab.eval.scoring import encode_pair
from tests.helpers import paths
from tests.helpers.eval_doubles import TableLM

torch.set_num_threads(1)
FIXTURES = paths.FIXTURES / "eval"
BIG = 10.0


def test_split_matches_lm_eval_lambada_openai():
    for row in map(json.loads, (FIXTURES / "lambada.jsonl").read_text().splitlines()):
        text = row["text"]
        item = cloze_item(text)
        assert item.context == " ".join(text.split(" ")[:-1])  # doc_to_text of lambada_openai
        assert item.target == " " + text.split(" ")[-1]  # doc_to_target
    with pytest.raises(UserError, match="last-word"):
        cloze_item("oneword")


def _rigged(successor: dict[str, str]) -> TableLM:
    """A bigram model whose argmax after character a is successor[a] (logit BIG, others 0)."""

    def table(prev: int) -> torch.Tensor:
        z = torch.zeros(257)
        nxt = successor.get(chr(prev)) if prev < 256 else None
        if nxt is not None:
            z[ord(nxt)] = BIG
        return z

    return TableLM(table, max_length=64)


@pytest.mark.fast
def test_exact_match_needs_every_target_token_greedy():
    item = cloze_item("we fed the dog")
    right = _rigged({"e": " ", " ": "d", "d": "o", "o": "g"})
    res = evaluate_cloze(right, [item]).scores[0]
    assert res.is_greedy and res.n_tokens == 4
    # 4 tokens, each with probability e^BIG / (e^BIG + 256)
    assert res.logprob == pytest.approx(4 * (BIG - math.log(math.exp(BIG) + 256)), abs=1e-5)

    wrong_last = _rigged({"e": " ", " ": "d", "d": "o", "o": "t"})  # 3 of 4 tokens right
    res = evaluate_cloze(wrong_last, [item]).scores[0]
    assert not res.is_greedy
    p_hit = BIG - math.log(math.exp(BIG) + 256)
    p_miss = -math.log(math.exp(BIG) + 256)
    assert res.logprob == pytest.approx(3 * p_hit + p_miss, abs=1e-5)


def test_cloze_metrics_aggregate_like_lm_eval():
    items = [cloze_item("we fed the dog"), cloze_item("a red hat")]
    lm = _rigged({"e": " ", " ": "d", "d": "o", "o": "g"})
    res = evaluate_cloze(lm, items, batch_size=1)
    m = res.metrics()
    assert m["acc"] == 0.5 and m["n"] == 2
    lps = [s.logprob for s in res.scores]
    assert m["logprob"] == pytest.approx(sum(lps) / 2)
    assert m["perplexity"] == pytest.approx(math.exp(-sum(lps) / 2))  # per item, as lm-eval


def test_encode_pair_moves_trailing_space_and_handles_empty_context():
    lm = TableLM(lambda p: torch.zeros(257))
    assert encode_pair(lm, "ab ", "c") == (list(b"ab"), list(b" c"))
    assert encode_pair(lm, "", "xy") == ([lm.prefix_id], list(b"xy"))


def test_load_cloze_file_and_errors(tmp_path):
    items = load_cloze_file(FIXTURES / "lambada.jsonl", limit=3)
    assert len(items) == 3 and items[0].target == " matches"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine line here"}\n{"txt": "oops"}\n')
    with pytest.raises(
        UserError, match=r"bad.jsonl:2: item 1 \(0-based\): field 'text' is missing"
    ):
        load_cloze_file(bad)
    with pytest.raises(UserError, match="does not exist"):
        load_cloze_file(tmp_path / "nope.jsonl")


DOC = (
    "The harbour town was built around a small stone lighthouse. Fishermen painted their boats "
    "in bright colours so that their families could recognise them from the cliffs. Every "
    "evening the keeper climbed the stairs and lit the lamp for the returning boats. In winter "
    "the storms were so strong that waves reached the top of the lighthouse. One night the "
    "lamp failed and the keeper held a lantern in the window until morning. The fishermen "
    "still tell their children about the night the keeper saved the boats. It was short. "
    "Nobody in town ever forgot him."
)


def test_passages_follow_the_documented_filters():
    sentences = split_sentences(DOC)
    assert len(sentences) == 8
    passages = passages_of(DOC, min_context_words=30)
    assert passages, "the boats sentence qualifies"
    for p in passages:
        target = p.rsplit(" ", 1)[1]
        context = p.rsplit(" ", 1)[0]
        assert target.isalpha() and len(target) >= 3 and target.lower() not in STOP_WORDS
        assert len(context.split(" ")) >= 30
        assert target.lower() in context.lower()  # the broad context contains the target
        assert not p.endswith(".")
    # "saved the boats" is refused: its 30-word context (sentences 4-5) never says "boats"
    assert [p.rsplit(" ", 3)[1:] for p in passages] == [["the", "returning", "boats"]]
    # a longer context reaches sentence 1 ("lighthouse") and admits the lighthouse sentence
    assert passages_of(DOC, min_context_words=50)[0].endswith("top of the lighthouse")
    # "him" is a stop word, "short" is in a 3-word sentence: neither is ever a target
    assert not any(p.endswith((" him", " short")) for p in passages_of(DOC, 5))
    assert passages_of(DOC, min_context_words=1000) == []


def test_build_cloze_set_is_deterministic_and_loadable(tmp_path):
    texts = [DOC.replace("boats", w) for w in ("boats", "ships", "nets", "sails", "crews")]
    out = tmp_path / "cloze.jsonl"
    rows = build_cloze_set(texts, n=3, min_context_words=30, seed=1, out=out)
    assert len(rows) == 3
    assert rows == build_cloze_set(texts, n=3, min_context_words=30, seed=1)
    assert rows != build_cloze_set(texts, n=3, min_context_words=30, seed=2)
    assert [it.context for it in load_cloze_file(out)] == [
        r["text"].rsplit(" ", 1)[0] for r in rows
    ]
    with pytest.raises(UserError, match="no passage"):
        build_cloze_set(["Too short."], n=3)
