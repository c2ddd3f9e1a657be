"""Per-forward facts every layer of a stack shares (positions, mask, position bias, rotary)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass
class AttnContext:
    """q_pos/k_pos: absolute positions [Tq]/[Tk]; allowed: [Tq, Tk] bool or None with is_causal;
    bias: [H, Tq, Tk] logit bias (ALiBi/T5) or None; rope: (cos, sin) at the new positions
    (q_pos), applied to q and to the new keys before they enter the cache; start: where new keys
    go in the cache; need_weights: return attention maps; padding: [B, Tk] bool, True at real
    tokens of a right-padded batch (encoders only), or None."""

    q_pos: Tensor
    k_pos: Tensor
    allowed: Tensor | None
    is_causal: bool
    bias: Tensor | None = None
    rope: tuple[Tensor, Tensor] | None = None
    start: int = 0
    need_weights: bool = False
    padding: Tensor | None = None
