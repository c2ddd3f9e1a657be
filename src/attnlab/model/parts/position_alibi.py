"""ALiBi (Press et al. 2022, "Train Short, Test Long"): bias[h, i, j] = -m_h |i - j| on the
attention logits, head slopes m_h = 2^(-8h/H) (interleaved for H not a power of two).

No params; no length limit, which is the point: the paper trains at short lengths and evaluates
far past them. It declares the attention engine's ALiBi score mod: under a causal mask the bias
is m_h (j - i), two exact extra q/k columns in SDPA's own dot product (O(T) memory, no
[H, T, T] table); otherwise a float bias over the key blocks the mask gathers. The flash
kernel (no bias input) is refused. In a causal
stack the bias m_h (j - i) is bilinear in positions, so ``score.virtual_heads_fused`` folds it
into two extra query/key columns (``key_fold``).
"""

from __future__ import annotations

from torch import Tensor

from attnlab.model.engine import ALiBi as EngineALiBi
from attnlab.model.engine import ScoreMod
from attnlab.model.positions import ALiBi
from attnlab.model.virtual_fused.alibi import alibi_columns
from attnlab.parts import Dims, PositionPart, register


@register("position", "alibi")
class ALiBiPosition(PositionPart):
    """A per-head linear penalty on the distance between query and key."""

    logit_bias = True
    key_fold = staticmethod(alibi_columns)
    key_fold_width = 2
    cost = "params 0; FLOPs 0 (an H x Tq x Tk bias); cache 0"

    @classmethod
    def param_count(cls, opts: PositionPart.Options, dims: Dims) -> int:
        return 0

    def __init__(self, opts: PositionPart.Options, dims: Dims) -> None:
        super().__init__(opts, dims)
        self.alibi = ALiBi(dims.n_heads)
        self._mods: dict[bool, ScoreMod] = {}

    def bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        return self.alibi(q_pos, k_pos)

    def score_mods(self, causal: bool) -> tuple[ScoreMod, ...]:
        """The engine's ALiBi: with a causal mask m_h (j - i), folded into two exact q/k
        columns (no [H, T, T] bias); otherwise -m_h |i - j| over the gathered pairs only."""
        return (self._mods.setdefault(causal, EngineALiBi(self.dims.n_heads, causal=causal)),)
