"""The prefix-LM mask (Raffel et al. 2020): j <= i or j < P; the first P tokens read each
other both ways, the rest causally.

No params; O(T^2 / 2 + P^2 / 2) pairs, run block-sparse (the causal blocks plus the prefix's).
Only a decoder-only LM has a prefix (an encoder-decoder already reads its input both ways), and
``generate`` needs a prompt of at least P tokens (generated tokens are never in the prefix).
"""

from __future__ import annotations

from pydantic import Field
from torch import Tensor

from attnlab.model.engine import Full, Mask, Prefix
from attnlab.parts import MaskPart, PartOptions, register
from attnlab.parts.slot_mask import needs


@register("mask", "prefix")
class PrefixMask(MaskPart):
    """Bidirectional over the first ``prefix_len`` tokens, causal after."""

    direction = "causal"
    decoder_only = True
    cost = "params 0; pairs T^2/2 + P^2/2"
    #: the battery's small models (T of about 8) with a pattern that leaves keys out
    check_config = ("model.mask.prefix_len=3",)

    class Options(PartOptions):
        prefix_len: int = Field(0, ge=0, description="P: tokens read both ways (>= 1)")

        def check(self, model) -> list[str]:
            return [] if self.prefix_len >= 1 else [needs(self, "prefix_len >= 1")]

    @classmethod
    def param_count(cls, opts, dims) -> int:
        return 0

    @classmethod
    def prompt_problem(cls, opts: Options, prompt_len: int) -> str | None:
        if prompt_len >= opts.prefix_len:
            return None
        return (
            f"the prompt has {prompt_len} tokens, fewer than model.mask.prefix_len="
            f"{opts.prefix_len}; generated tokens are never in the prefix"
        )

    def forward(self, causal: bool, doc_ids: Tensor | None = None) -> Mask:
        return Prefix(self.opts.prefix_len) if causal else Full()
