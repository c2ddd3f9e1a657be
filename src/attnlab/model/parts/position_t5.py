"""T5 relative position bias (Raffel et al. 2020): bias[h, i, j] = B[bucket(j - i), h].

Offsets below buckets/2 get exact buckets, larger ones log-spaced buckets up to
``max_distance`` (every farther offset shares the last bucket); an encoder (``dims.causal``
False) splits the buckets between the two directions. Params buckets * H per stack, shared by
its layers; no matmul FLOPs; no length limit (far offsets reuse the last bucket). It declares
the engine's T5 score mod: a float bias over the key blocks the mask gathers (SDPA keeps its
fused kernel through a recomputed-bias backward, ``model/engine/biased.py``).
"""

from __future__ import annotations

from pydantic import Field
from torch import Tensor, nn

from attnlab.model.engine import ScoreMod, T5Bias
from attnlab.model.positions import T5RelativeBias
from attnlab.parts import Dims, PartOptions, PositionPart, register


@register("position", "t5")
class T5Position(PositionPart):
    """A learned bias per head and bucketed relative offset."""

    logit_bias = True
    cost = "params buckets*H per stack; FLOPs 0 (an H x Tq x Tk bias); cache 0"

    class Options(PartOptions):
        buckets: int = Field(32, ge=2, description="number of offset buckets")
        max_distance: int = Field(128, ge=2, description="offsets beyond share the last bucket")

    @classmethod
    def param_count(cls, opts: Options, dims: Dims) -> int:
        return opts.buckets * dims.n_heads

    def __init__(self, opts: Options, dims: Dims) -> None:
        super().__init__(opts, dims)
        self.buckets, self.max_distance = opts.buckets, opts.max_distance
        self.bidirectional = not dims.causal
        self.table = nn.Embedding(opts.buckets, dims.n_heads)
        self.__dict__["_mod"] = None  # the engine mod, made on first use (not a submodule)

    bucket = T5RelativeBias.bucket

    def bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        return T5RelativeBias.forward(self, q_pos, k_pos)

    def score_mods(self, causal: bool) -> tuple[ScoreMod, ...]:
        """The engine's T5 bias over this part's table: a float bias over the gathered pairs,
        its gradient into the table (no [H, T, T] table kept for the whole sequence)."""
        if self._mod is None:
            mod = T5Bias(
                self.dims.n_heads,
                self.buckets,
                self.max_distance,
                self.bidirectional,
                table=self.table,  # shared; the mod is no submodule: the state dict is unchanged
            )
            self.__dict__["_mod"] = mod
        return (self._mod,)
