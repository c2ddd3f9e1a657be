"""The full mask: every query sees every key (an encoder's, BERT's).

No params; SDPA with no mask. A causal LM refuses it (it would see the tokens it predicts); in an
encoder-decoder it is the encoder's mask, and the decoder keeps its causal one.
"""

from __future__ import annotations

from torch import Tensor

from attnlab.model.engine import Causal, Full, Mask
from attnlab.parts import MaskPart, register


@register("mask", "full")
class FullMask(MaskPart):
    """All pairs: a bidirectional stack's mask."""

    plain = True
    direction = "bidirectional"
    cost = "params 0; pairs T^2"

    @classmethod
    def param_count(cls, opts, dims) -> int:
        return 0

    def forward(self, causal: bool, doc_ids: Tensor | None = None) -> Mask:
        return Causal() if causal else Full()  # causal: an encoder-decoder's decoder
