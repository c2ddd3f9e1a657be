"""Per-forward facts every layer of a stack shares (positions, mask, score mods, rotary)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor


class AttnContext:
    """What one forward of a stack gives its layers.

    ``q_pos``/``k_pos``: absolute positions [Tq]/[Tk]; ``mask``: the attention engine's
    :class:`~attnlab.model.engine.Mask` (the mask part's, for this stack's direction), or None
    (the dense ``allowed`` / ``is_causal`` pair alone: cross-attention); ``mods``: the position
    part's score mods; ``rotate``: the position part's rotation at the new positions (q_pos),
    applied to q and to the new keys before they enter the cache, or None; ``start``: where new
    keys go in the cache (the queries' offset); ``need_weights``: return attention maps;
    ``padding``: [B, Tk] bool, True at real tokens of a right-padded batch (encoders), or None.

    The dense forms, for score parts that form the T x T matrix and for ``attnlab inspect``:
    ``allowed`` [Tq, Tk] bool or None with ``is_causal`` (SDPA's own pattern), and ``bias``
    [H, Tq, Tk] (the position part's ``bias``) or None, each computed on first read and kept
    for the other layers; the fused path never reads them.
    """

    def __init__(
        self,
        q_pos: Tensor,
        k_pos: Tensor,
        allowed: Tensor | None = None,
        is_causal: bool = False,
        bias: Tensor | None = None,
        rotate: Callable[[Tensor], Tensor] | None = None,
        start: int = 0,
        need_weights: bool = False,
        padding: Tensor | None = None,
        *,
        mask: Any = None,
        mods: tuple[Any, ...] = (),
        dense_allowed: Callable[[], Tensor | None] | None = None,
        dense_bias: Callable[[], Tensor | None] | None = None,
    ) -> None:
        self.q_pos, self.k_pos, self.is_causal = q_pos, k_pos, is_causal
        self.rotate, self.start, self.need_weights, self.padding = (
            rotate,
            start,
            need_weights,
            padding,
        )
        self.mask, self.mods = mask, mods
        self._allowed, self._bias = allowed, bias
        self._dense_allowed, self._dense_bias = dense_allowed, dense_bias

    @property
    def allowed(self) -> Tensor | None:
        if self._allowed is None and self._dense_allowed is not None:
            self._allowed, self._dense_allowed = self._dense_allowed(), None
        return self._allowed

    @property
    def bias(self) -> Tensor | None:
        if self._bias is None and self._dense_bias is not None:
            self._bias, self._dense_bias = self._dense_bias(), None
        return self._bias
