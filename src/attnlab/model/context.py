"""Per-forward facts every layer of a stack shares (positions, mask, position bias, rotary)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass
class AttnContext:
    """q_pos/k_pos: absolute positions [Tq]/[Tk]; allowed: [Tq, Tk] bool or None with is_causal;
    bias: [H, Tq, Tk] logit bias (ALiBi/T5) or None; rope_q/rope_k: (cos, sin) or None;
    start: where new keys go in the cache; need_weights: return attention maps."""

    q_pos: Tensor
    k_pos: Tensor
    allowed: Tensor | None
    is_causal: bool
    bias: Tensor | None = None
    rope_q: tuple[Tensor, Tensor] | None = None
    rope_k: tuple[Tensor, Tensor] | None = None
    start: int = 0
    need_weights: bool = False
