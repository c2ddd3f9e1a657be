"""Token-weighted perplexity of documents with a sliding window.

Every document is scored on its own, conditioned on the model's prefix token, with every token
scored exactly once (``windows.py``). Over documents ``d`` with token log-probabilities
``log p(x_t | x_<t)``:

    loss = -(sum_d sum_t log p) / N_tokens          (nats per token)
    perplexity = exp(loss)
    bits_per_byte = -(sum_d sum_t log p) / (ln 2 * N_bytes)       (UTF-8 bytes of the text)
    word_perplexity = exp(-(sum log p) / N_words)                  (whitespace-split words)

Bits per byte and word perplexity do not depend on the tokenizer, so they compare models with
different vocabularies; loss and perplexity only compare models sharing a tokenizer.
Cost: ``~n / stride`` forwards of ``max_length`` tokens per document of ``n`` tokens.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from attnlab.base.errors import UserError
from attnlab.eval.lm import LanguageModel
from attnlab.eval.scoring import score_continuations
from attnlab.eval.windows import window_requests


@dataclass(frozen=True)
class Document:
    """One document as token ids in the model's vocabulary, with its text sizes when known."""

    tokens: Sequence[int]
    n_bytes: int | None = None
    n_words: int | None = None

    @classmethod
    def from_text(cls, lm: LanguageModel, text: str) -> Document:
        return cls(lm.encode(text), len(text.encode("utf-8")), count_words(text))


def count_words(text: str) -> int:
    """Words as lm-evaluation-harness counts them for word perplexity: ``re.split(r"\\s+")``."""
    return len(re.split(r"\s+", text))


@dataclass(frozen=True)
class PerplexityResult:
    """Totals and the derived metrics (see the module docstring)."""

    logprob: float
    tokens: int
    documents: int
    bytes: int | None
    words: int | None

    @property
    def loss(self) -> float:
        return -self.logprob / self.tokens if self.tokens else math.nan

    @property
    def perplexity(self) -> float:
        return math.exp(self.loss) if self.tokens else math.nan

    @property
    def bits_per_byte(self) -> float | None:
        return -self.logprob / (math.log(2) * self.bytes) if self.bytes else None

    @property
    def word_perplexity(self) -> float | None:
        return math.exp(-self.logprob / self.words) if self.words else None

    def metrics(self) -> dict[str, float | int | None]:
        out: dict[str, float | int | None] = {
            "loss": self.loss,
            "perplexity": self.perplexity,
            "tokens": self.tokens,
            "documents": self.documents,
        }
        if self.bytes:
            out |= {"bits_per_byte": self.bits_per_byte, "bytes": self.bytes}
        if self.words:
            out |= {"word_perplexity": self.word_perplexity}
        return out

    def to_dict(self) -> dict[str, object]:
        return asdict(self) | self.metrics()


def default_stride(max_length: int) -> int:
    """Half the context: each token sees at least ``max_length / 2`` tokens once a document is
    longer than the window."""
    return max(1, max_length // 2)


def document_logprobs(
    lm: LanguageModel,
    documents: Sequence[Sequence[int]],
    stride: int | None = None,
    batch_size: int = 8,
    progress: bool = False,
    max_length: int | None = None,
) -> list[float]:
    """Total log-probability (nats) of each token document, every token scored once, in
    windows of ``max_length`` tokens (default ``lm.max_length``)."""
    length = max_length or lm.max_length
    stride = stride or default_stride(length)
    requests, owner = [], []
    for d, tokens in enumerate(documents):
        reqs = window_requests(tokens, lm.prefix_id, length, stride)
        requests += reqs
        owner += [d] * len(reqs)
    totals = [0.0] * len(documents)
    for d, score in zip(owner, score_continuations(lm, requests, batch_size, progress)):
        totals[d] += score.logprob
    return totals


def perplexity(
    lm: LanguageModel,
    documents: Iterable[Document],
    stride: int | None = None,
    batch_size: int = 8,
    progress: bool = False,
    max_length: int | None = None,
) -> PerplexityResult:
    """Token-weighted perplexity over ``documents`` (empty documents are skipped), in windows of
    ``max_length`` tokens (default ``lm.max_length``)."""
    docs = [d for d in documents if len(d.tokens)]
    if not docs:
        raise UserError("no document to score: every one is empty; give documents with text")
    tokens = [d.tokens for d in docs]
    logprobs = document_logprobs(lm, tokens, stride, batch_size, progress, max_length)
    sizes_known = bool(docs) and all(d.n_bytes is not None for d in docs)
    words_known = bool(docs) and all(d.n_words is not None for d in docs)
    return PerplexityResult(
        logprob=sum(logprobs),
        tokens=sum(len(d.tokens) for d in docs),
        documents=len(docs),
        bytes=sum(d.n_bytes or 0 for d in docs) if sizes_known else None,
        words=sum(d.n_words or 0 for d in docs) if words_known else None,
    )
