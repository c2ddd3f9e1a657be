"""Per-forward facts every layer of a stack shares (positions, mask, position bias, rotary)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor


@dataclass
class AttnContext:
    """q_pos/k_pos: absolute positions [Tq]/[Tk]; allowed: [Tq, Tk] bool or None with is_causal;
    bias: [H, Tq, Tk] logit bias of the position part or None; rotate: the position part's
    rotation at the new positions (q_pos), applied to q and to the new keys before they enter
    the cache, or None; start: where new keys
    go in the cache; need_weights: return attention maps; padding: [B, Tk] bool, True at real
    tokens of a right-padded batch (encoders only), or None."""

    q_pos: Tensor
    k_pos: Tensor
    allowed: Tensor | None
    is_causal: bool
    bias: Tensor | None = None
    rotate: Callable[[Tensor], Tensor] | None = None
    start: int = 0
    need_weights: bool = False
    padding: Tensor | None = None
