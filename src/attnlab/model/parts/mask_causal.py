"""The causal mask: query i sees keys j <= i (in a bidirectional stack, e.g. an
encoder-decoder's encoder, every key: the stack's own direction).

No params; SDPA's ``is_causal`` (O(T) memory, the flash kernel's own), so the baseline runs
exactly the call it always ran.
"""

from __future__ import annotations

from torch import Tensor

from attnlab.model.engine import Causal, Full, Mask
from attnlab.parts import MaskPart, register


@register("mask", "causal")
class CausalMask(MaskPart):
    """j <= i: the decoder's mask."""

    plain = True
    direction = "causal"  # an encoder refuses it; an encoder-decoder's encoder reads both ways
    cost = "params 0; pairs T(T+1)/2"

    @classmethod
    def param_count(cls, opts, dims) -> int:
        return 0

    def forward(self, causal: bool, doc_ids: Tensor | None = None) -> Mask:
        return Causal() if causal else Full()
