"""The sliding-window mask (Beltagy et al. 2020; Mistral): 0 <= i - j < w (causal) or
|i - j| < w (bidirectional).

No params; O(T w) pairs: the engine gathers only the key blocks within the window (block-sparse
SDPA on CPU, flex's block mask on CUDA), so time and memory grow with T w, not T^2.
"""

from __future__ import annotations

from pydantic import Field
from torch import Tensor

from attnlab.model.engine import Mask, Sliding
from attnlab.parts import MaskPart, PartOptions, register
from attnlab.parts.slot_mask import needs


@register("mask", "sliding")
class SlidingMask(MaskPart):
    """Each query sees the ``window`` nearest keys (its own included)."""

    cost = "params 0; pairs T w"
    #: the battery's small models (T of about 8) with a pattern that leaves keys out
    check_config = ("model.mask.window=3",)

    class Options(PartOptions):
        window: int = Field(0, ge=0, description="w: keys within this distance (>= 1)")

        def check(self, model) -> list[str]:
            return [] if self.window >= 1 else [needs(self, "window >= 1")]

    @classmethod
    def param_count(cls, opts, dims) -> int:
        return 0

    def forward(self, causal: bool, doc_ids: Tensor | None = None) -> Mask:
        return Sliding(self.opts.window, causal=causal)
