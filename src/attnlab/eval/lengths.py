"""Perplexity against evaluation length ("train short, test long", Press et al. 2022).

The validation documents are joined into one token stream (each preceded by the model's prefix
token) and cut into non-overlapping windows of L + 1 tokens; the model reads the first L and
predicts the last L, so position t of every window is scored with exactly t tokens of context.
Over the W windows (the first ``limit`` when given)::

    loss_by_position[t] = mean_w -log p(x_(w,t+1) | x_(w,0..t))        t = 0 .. L-1
    loss = mean_t loss_by_position[t]              (nats per token; perplexity = exp(loss))

A model whose positions hold at long range keeps ``loss_by_position`` flat (or falling) past its
training length; one whose positions break shows the rise where they do. Lengths past the
model's position limit (a learned table) are refused before anything runs, with the reason its
position part declares. Cost: W forwards of L tokens per length.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from attnlab.base.errors import UserError
from attnlab.eval.lm import LanguageModel
from attnlab.eval.perplexity import Document


@dataclass(frozen=True)
class LengthResult:
    """The loss at one evaluation length, overall and by token position."""

    length: int
    windows: int
    loss_by_position: list[float]

    @property
    def tokens(self) -> int:
        return self.windows * self.length

    @property
    def loss(self) -> float:
        return sum(self.loss_by_position) / self.length

    def metrics(self) -> dict[str, float | int]:
        return {
            "loss": self.loss,
            "perplexity": math.exp(self.loss),
            "tokens": self.tokens,
            "windows": self.windows,
        }

    def to_dict(self) -> dict[str, object]:
        return asdict(self) | self.metrics()


def parse_lengths(text: str | Sequence[int] | None) -> list[int] | None:
    """``"64,128,256"`` (or a list) -> [64, 128, 256]: positive, ascending, no repeats."""
    if text is None:
        return None
    items = text.split(",") if isinstance(text, str) else list(text)
    try:
        lengths = [int(str(x).strip()) for x in items if str(x).strip()]
    except ValueError:
        raise UserError(
            f"--lengths {text!r} must be comma-separated token counts, e.g. 64,128,256"
        ) from None
    if not lengths or any(n < 2 for n in lengths):
        raise UserError(f"--lengths {text!r}: every length must be at least 2 tokens")
    return sorted(set(lengths))


def check_lengths(lm: LanguageModel, lengths: Sequence[int]) -> None:
    """Refuse, before anything runs, a length the model cannot be fed (and why)."""
    too_long = [n for n in lengths if not lm.can_take(n)]
    if too_long:
        raise UserError(
            f"cannot evaluate {lm.name} at {', '.join(map(str, too_long))} tokens: its context "
            f"is {lm.context_limit} tokens{lm.limit_reason}. Choose lengths up to "
            f"{lm.context_limit}, or train with a position part that has no length limit "
            "(`attnlab parts position` lists them)"
        )


def token_stream(documents: Sequence[Document], prefix_id: int) -> torch.Tensor:
    """The documents as one stream of ids, each document preceded by ``prefix_id``."""
    parts = [torch.tensor([prefix_id, *d.tokens], dtype=torch.long) for d in documents if d.tokens]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)


@torch.no_grad()
def length_loss(
    lm: LanguageModel,
    stream: torch.Tensor,
    length: int,
    limit: int | None = None,
    batch_size: int = 8,
) -> LengthResult:
    """The loss of ``lm`` at ``length`` over the windows of ``stream`` (module docstring)."""
    n = (stream.numel() - 1) // length
    if limit is not None:
        n = min(n, limit)
    if n < 1:
        raise UserError(
            f"the validation text holds {stream.numel()} tokens, fewer than one window of "
            f"{length + 1}; evaluate at shorter lengths or on a larger corpus"
        )
    sums = torch.zeros(length, dtype=torch.float64)
    for start in range(0, n, batch_size):
        rows = range(start, min(n, start + batch_size))
        win = torch.stack([stream[w * length : w * length + length + 1] for w in rows])
        win = win.to(lm.device)
        logits = lm.logits(win[:, :-1])
        nll = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), win[:, 1:].reshape(-1), reduction="none"
        )
        sums += nll.view(len(rows), length).double().sum(0).cpu()
    return LengthResult(length, n, (sums / n).tolist())
