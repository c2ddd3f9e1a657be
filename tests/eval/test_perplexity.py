"""Perplexity: sliding windows score every token once; equals a direct full-context computation."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from attnlab.base.errors import UserError
from attnlab.eval.corpus import split_documents
from attnlab.eval.hf import HFCausalLM
from attnlab.eval.perplexity import Document, document_logprobs, perplexity
from attnlab.eval.windows import sliding_windows, window_requests
from tests.helpers.eval_doubles import TableLM, byte_hf_tokenizer, tiny_hf_model

torch.set_num_threads(1)


@pytest.mark.parametrize("n", [1, 5, 16, 17, 40, 100])
@pytest.mark.parametrize(("L", "stride"), [(16, 16), (16, 8), (16, 5), (16, 1), (7, 3)])
def test_windows_score_every_token_once_with_enough_context(n, L, stride):
    windows = sliding_windows(n, L, stride)
    scored = [j for w in windows for j in range(w.end - w.n_scored, w.end)]
    assert scored == list(range(n))  # target j (token x_{j+1}) scored exactly once, in order
    for k, w in enumerate(windows):
        assert 0 < w.end - w.start <= L
        if k > 0:  # the first scored target sees the window's earlier inputs as context
            first = w.end - w.n_scored
            assert first - w.start + 1 >= min(L - stride + 1, first + 1)


@pytest.mark.parametrize("n", [1, 3, 8, 9, 25])
def test_stride_equal_to_max_length_is_lm_eval_rolling(n):
    tokens = list(range(10, 10 + n))
    ours = window_requests(tokens, prefix_id=0, max_length=8, stride=8)
    theirs = [
        tuple(map(list, make_disjoint_window(p)))
        for p in get_rolling_token_windows(tokens, prefix_token=0, max_seq_len=8, context_len=1)
    ]
    assert [(list(c), list(k)) for c, k in ours] == theirs


def test_bad_stride_is_a_user_error():
    with pytest.raises(UserError, match="stride"):
        sliding_windows(10, 8, 9)


@pytest.fixture(scope="module")
def tiny_lm():
    return HFCausalLM(tiny_hf_model("gpt2", max_length=64), byte_hf_tokenizer(), name="tiny")


def _direct_logprob(lm: HFCausalLM, tokens: list[int]) -> float:
    ids = torch.tensor([[lm.prefix_id, *tokens]])
    with torch.no_grad():
        logp = lm.model(ids).logits.float().log_softmax(-1)[0, :-1]
    return float(logp.gather(-1, ids[0, 1:, None]).sum())


@pytest.mark.fast
def test_perplexity_equals_full_context_when_documents_fit(tiny_lm):
    texts = ["The cat sat on the mat.", "A much longer second document, ok?", "hi"]
    docs = [Document.from_text(tiny_lm, t) for t in texts]
    # batch of 3 mixes lengths: right padding must not change any scored position
    got = document_logprobs(tiny_lm, [d.tokens for d in docs], batch_size=3)
    want = [_direct_logprob(tiny_lm, list(d.tokens)) for d in docs]
    assert got == pytest.approx(want, abs=1e-4)
    res = perplexity(tiny_lm, docs, batch_size=2)
    n_tokens = sum(len(t.encode()) for t in texts)
    assert res.tokens == n_tokens and res.documents == 3
    assert res.loss == pytest.approx(-sum(want) / n_tokens, rel=1e-5)
    assert res.perplexity == pytest.approx(math.exp(-sum(want) / n_tokens), rel=1e-5)
    assert res.bits_per_byte == pytest.approx(-sum(want) / math.log(2) / n_tokens, rel=1e-5)


def test_long_document_windows_see_only_max_length_tokens(tiny_lm):
    tokens = list(b"0123456789 abcdefghij " * 5)  # 110 tokens > max_length 64
    direct = _direct_logprob(tiny_lm, tokens[:63])  # the first window is full-context
    total = document_logprobs(tiny_lm, [tokens[:63]], stride=16)[0]
    assert total == pytest.approx(direct, abs=1e-4)
    # stride 1 is the strongest context: every token sees min(position, 63) previous tokens
    seq = torch.tensor([tiny_lm.prefix_id, *tokens])
    want = 0.0
    with torch.no_grad():
        for j in range(len(tokens)):
            lo = max(0, j + 1 - 64)
            logits = tiny_lm.model(seq[lo : j + 1][None]).logits[0, -1].float()
            want += float(logits.log_softmax(-1)[seq[j + 1]])
    got = document_logprobs(tiny_lm, [tokens], stride=1, batch_size=16)[0]
    assert got == pytest.approx(want, abs=1e-3)


def _bigram(prev: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(prev)
    return torch.randn(257, generator=g)


@pytest.mark.parametrize("stride", [1, 4, 7, 8])
def test_windowed_total_counts_each_token_once(stride):
    lm = TableLM(_bigram, max_length=8)  # bigram: context beyond one token does not matter
    tokens = list(b"sliding windows over a long text")
    seq = [lm.prefix_id, *tokens]
    want = sum(
        float(_bigram(a).log_softmax(-1)[b]) for a, b in itertools.pairwise(seq)
    )  # any token scored twice or never would change this total
    got = document_logprobs(lm, [tokens], stride=stride, batch_size=3)[0]
    assert got == pytest.approx(want, abs=1e-4)
    assert all(t <= 8 for _, t in lm.calls)


def test_uniform_model_has_vocab_perplexity_and_8_bits_per_byte():
    lm = TableLM(lambda prev: torch.zeros(257), max_length=16)
    docs = [Document.from_text(lm, "plain ascii text, one byte per token")]
    res = perplexity(lm, docs)
    assert res.perplexity == pytest.approx(257, rel=1e-5)
    assert res.bits_per_byte == pytest.approx(math.log2(257), rel=1e-5)
    assert res.metrics()["word_perplexity"] == pytest.approx(257 ** (res.tokens / 7), rel=1e-4)


def test_split_documents_at_eos():
    eos = 9
    toks = np.array([1, 2, eos, eos, 3, eos, 4, 5])
    docs = [d.tolist() for d in split_documents(toks, eos)]
    assert docs == [[1, 2], [3], [4, 5]]
