"""Learned absolute positions (GPT-2): p_t = E_pos[t], added to the token embedding of t.

Params max_seq_len * d (counted in the ``position`` row, an embedding); no FLOPs (a lookup).
Its table ends at ``model.max_seq_len``: a position past it has no trained vector, so this part
declares that length as its limit and evaluation or generation beyond it is refused.
"""

from __future__ import annotations

from torch import Tensor, nn

from attnlab.parts import Dims, PositionPart, register


@register("position", "learned")
class LearnedPosition(PositionPart):
    """A trained vector per absolute position, up to ``model.max_seq_len``."""

    absolute = True
    limit_noun = "learned positions"
    cost = "params max_seq_len*d; FLOPs 0; cache 0"
    limit_reason = (
        "learned positions have one trained vector per position up to model.max_seq_len and "
        "none past it"
    )

    @classmethod
    def length_limit(cls, opts: PositionPart.Options, model) -> int | None:
        return model.max_seq_len

    @classmethod
    def param_count(cls, opts: PositionPart.Options, dims: Dims) -> int:
        return dims.model.max_seq_len * dims.d_model

    def __init__(self, opts: PositionPart.Options, dims: Dims) -> None:
        super().__init__(opts, dims)
        self.max_len = dims.model.max_seq_len
        self.table = nn.Embedding(self.max_len, dims.d_model)

    def embed(self, positions: Tensor) -> Tensor:
        return self.table(positions)
