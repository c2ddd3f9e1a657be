"""What every attnlab model returns."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass
class ModelOutput:
    """logits [B, T, V] (None when the loss was computed without them); loss = mean cross-entropy over targets != -100 (None without targets);
    aux_loss = weighted auxiliary losses (MoE balance + z-loss), to be added when optimising;
    cache = the updated KV cache when one was passed; attn = per-layer probabilities if asked."""

    logits: Tensor | None
    loss: Tensor | None = None
    aux_loss: Tensor | None = None
    cache: object | None = None
    attn: list[Tensor] | None = None

    @property
    def total_loss(self) -> Tensor:
        """The quantity to optimise: loss + aux_loss."""
        assert self.loss is not None, "total_loss needs targets"
        return self.loss if self.aux_loss is None else self.loss + self.aux_loss
