"""A mask part written from outside attnlab: a causal dilated window (Longformer's dilated
heads); --plugin examples/dilated_window.py.

Query i sees keys i, i - r, i - 2r, ..., i - (w - 1) r: w keys spread over a span of (w - 1) r + 1
positions (r = ``dilation``). The mask declares its mask_mod (FlexAttention's convention, so the
same function runs in flex) and two hints, ``causal`` and ``window`` (the span), which let the
engine gather only the key blocks within the span: O(T w r) pairs instead of T^2 / 2.

    [model.mask]
    kind = "dilated_window"
    width = 64
    dilation = 4

It also runs alone in the engine:

    from attnlab.model.engine import AttentionEngine, AttentionSpec
    out, _ = AttentionEngine(AttentionSpec(DilatedWindow(64, 4)))(q, k, v)
"""

from attnlab.model.engine import Mask
from attnlab.parts import Field, MaskPart, PartOptions, register


class DilatedWindow(Mask):
    """0 <= i - j < w r and (i - j) divisible by r."""

    name = "dilated_window"
    causal = True

    def __init__(self, width: int, dilation: int) -> None:
        self.width, self.dilation = width, dilation
        self.window = (width - 1) * dilation + 1  # the hint: no key farther back than this

    def mask_mod(self, b, h, q_idx, kv_idx):
        d = q_idx - kv_idx
        return (d >= 0) & (d < self.window) & (d % self.dilation == 0)


@register("mask", "dilated_window")
class DilatedWindowMask(MaskPart):
    """w keys, every r-th, back from each query (a causal stack only)."""

    direction = "causal"
    cost = "params 0; pairs T w"

    class Options(PartOptions):
        width: int = Field(8, ge=1, description="w: keys each query sees")
        dilation: int = Field(2, ge=1, description="r: the step between them")

    @classmethod
    def param_count(cls, opts, dims):
        return 0

    def forward(self, causal, doc_ids=None):
        return DilatedWindow(self.opts.width, self.opts.dilation)
