"""Sliding windows that score every token of a long text exactly once.

A text of ``n`` tokens ``x_1..x_n`` is preceded by a prefix token ``x_0`` (BOS/EOS), so ``x_1`` is
predicted too. Window ``w`` feeds inputs ``x_a..x_{b-1}`` (at most ``L = max_length`` tokens) and
scores only its last ``k`` predictions ``x_{b-k+1}..x_b``:

* the first window: ``a = 0``, ``b = min(L, n)``, ``k = b`` (every prediction is new);
* then ``b' = min(b + stride, n)``, ``k = b' - b``, ``a = max(0, b' - L)``.

Each scored token therefore sees at least ``L - stride`` tokens of context once the text is longer
than ``L`` (the WikiText protocol of the Hugging Face perplexity guide, here without its off-by-one
that never scores a window's first token). ``stride = L`` gives disjoint windows and reproduces
lm-evaluation-harness's ``loglikelihood_rolling`` exactly; a smaller stride costs ``~L/stride``
times more compute for more context per token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from attnlab.base.errors import UserError


@dataclass(frozen=True)
class Window:
    """Inputs ``x_start..x_end-1`` score the predictions of ``x_end-n_scored+1..x_end``."""

    start: int
    end: int
    n_scored: int


def sliding_windows(n_tokens: int, max_length: int, stride: int) -> list[Window]:
    """The windows over a text of ``n_tokens`` (see the module docstring)."""
    if max_length < 1:
        raise UserError(f"max_length must be >= 1, got {max_length}")
    if not 1 <= stride <= max_length:
        raise UserError(
            f"stride={stride} must be between 1 and the model's max_length={max_length}"
        )
    if n_tokens <= 0:
        return []
    end = min(max_length, n_tokens)
    out = [Window(0, end, end)]
    while end < n_tokens:
        new_end = min(end + stride, n_tokens)
        out.append(Window(max(0, new_end - max_length), new_end, new_end - end))
        end = new_end
    return out


def window_requests(
    tokens: Sequence[int], prefix_id: int, max_length: int, stride: int
) -> list[tuple[list[int], list[int]]]:
    """``(context, continuation)`` token requests whose continuations tile ``tokens`` exactly
    once, for :func:`attnlab.eval.scoring.score_continuations`."""
    seq = [prefix_id, *tokens]
    return [
        (seq[w.start : w.end - w.n_scored + 1], seq[w.end - w.n_scored + 1 : w.end + 1])
        for w in sliding_windows(len(tokens), max_length, stride)
    ]
