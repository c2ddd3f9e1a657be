"""Log-likelihood of continuations given contexts, batched: the primitive under every task.

For a request ``(context, continuation)`` of token ids the score is

    log p(continuation | context) = sum_i log softmax(z_{n-k+i-1})[c_i],   i = 1..k

where ``z`` are the logits of the input ``(context + continuation)[:-1]`` (length ``n``) and
``k = len(continuation)``; ``is_greedy`` says every ``c_i`` is the argmax of its position. When
``context + continuation`` exceeds ``max_length + 1`` tokens the context is cut from the left, as
lm-evaluation-harness does; a continuation longer than ``max_length`` cannot be scored exactly
(:class:`ContinuationTooLongError`, naming the request; lm-eval 0.4.13's ``HFLM`` stops on an
``assert`` there, the lm-eval adapter cuts it: :func:`attnlab.eval.harness.fit_continuations`).
Requests are sorted by length so a batch wastes little padding; rows
are right-padded and the model is causal, so padding never reaches a scored position.

Cost: one forward per batch of ``batch_size`` requests, ``O(B * T * V)`` memory for the logits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from attnlab.base.errors import UserError
from attnlab.eval.lm import LanguageModel


@dataclass(frozen=True)
class ContinuationScore:
    """Sum of the continuation's token log-probabilities (nats) and whether greedy decoding
    would have produced it."""

    logprob: float
    is_greedy: bool
    n_tokens: int


Request = tuple[Sequence[int], Sequence[int]]


class ContinuationTooLongError(UserError):
    """A continuation that does not fit the model's context; ``label`` is what the caller called
    the request (e.g. ``item 7, choice 2``)."""

    def __init__(self, label: str, n_context: int, n_continuation: int, max_length: int) -> None:
        self.label = label
        self.lengths = (n_context, n_continuation, max_length)
        super().__init__(
            f"{label}: its continuation has {n_continuation} tokens (context {n_context}), more "
            f"than the model's context of {max_length} tokens, so it cannot be scored; shorten "
            "or drop the item, or use a model with a longer context"
        )


def _model_input(
    lm: LanguageModel, ctx: Sequence[int], cont: Sequence[int], label: str
) -> list[int]:
    if not ctx:
        raise ValueError("score_continuations needs a non-empty context (use lm.prefix_id)")
    if not cont:
        raise ValueError("score_continuations needs a non-empty continuation")
    if len(cont) > lm.max_length:
        raise ContinuationTooLongError(label, len(ctx), len(cont), lm.max_length)
    return (list(ctx) + list(cont))[-(lm.max_length + 1) :][:-1]


@torch.no_grad()
def score_continuations(
    lm: LanguageModel,
    requests: Sequence[Request],
    batch_size: int = 8,
    progress: bool = False,
    labels: Sequence[str] | None = None,
) -> list[ContinuationScore]:
    """Score every ``(context_ids, continuation_ids)`` request; results keep the input order.
    ``labels`` name the requests in errors (default ``request N``, from 0); every request is
    checked before the first forward."""
    if batch_size < 1:
        raise UserError(f"batch_size must be >= 1, got {batch_size}")
    if labels is None:
        labels = [f"request {i}" for i in range(len(requests))]
    inputs = [_model_input(lm, c, k, name) for (c, k), name in zip(requests, labels, strict=True)]
    order = sorted(range(len(requests)), key=lambda i: -len(inputs[i]))
    out: list[ContinuationScore | None] = [None] * len(requests)
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    iterator = batches
    if progress:
        from rich.progress import track

        iterator = track(batches, description="scoring", transient=True)
    for batch in iterator:
        width = len(inputs[batch[0]])
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for row, i in enumerate(batch):
            seq = inputs[i]
            ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            mask[row, : len(seq)] = 1
        first = min(len(inputs[i]) - len(requests[i][1]) for i in batch)  # the first one read
        logits = lm.scored_logits(ids.to(lm.device), mask.to(lm.device), first)
        for row, i in enumerate(batch):
            cont = list(requests[i][1])
            n, k = len(inputs[i]), len(cont)
            z = logits[row, n - k : n].float().log_softmax(-1)
            target = torch.tensor(cont, dtype=torch.long, device=z.device)
            logprob = float(z.gather(-1, target[:, None]).sum())
            greedy = bool((z.argmax(-1) == target).all())
            out[i] = ContinuationScore(logprob, greedy, k)
    return [s for s in out if s is not None]


def encode_pair(lm: LanguageModel, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """Token ids of ``(context, continuation)`` exactly as lm-evaluation-harness makes them:
    trailing spaces of the context move to the continuation, the pair is encoded whole and split
    at the length of the encoded context (so a merge across the boundary stays in the
    continuation); an empty context becomes the prefix token."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces and context.strip():
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    if context == "":
        cont = lm.encode(continuation)
        if cont and cont[0] == lm.prefix_id:
            return cont[:1], cont[1:]
        return [lm.prefix_id], cont
    whole = lm.encode(context + continuation)
    ctx = lm.encode(context)
    return ctx, whole[len(ctx) :]


def mean_and_stderr(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and its standard error ``sqrt(var / n)`` with the sample variance (ddof = 1), as
    lm-evaluation-harness reports it. One value has no sample variance: its standard error is
    None ("n/a", as lm-eval writes it), not NaN, which would read as a broken model."""
    n = len(values)
    if n == 0:
        raise UserError("no items to score; give a task file with at least one item")
    mean = sum(values) / n
    if n == 1:
        return mean, None
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, (var / n) ** 0.5
