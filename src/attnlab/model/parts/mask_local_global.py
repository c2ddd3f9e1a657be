"""Local + global attention (Longformer, Beltagy et al. 2020): the sliding window, plus global
tokens (the first ``n_global`` and every ``global_every``-th) that see and are seen by all (in a
causal stack only earlier positions).

No params; O(T (w + G)) pairs: the window's key blocks gathered per query block, the global
keys one by one, the global queries' rows over all keys.
"""

from __future__ import annotations

from pydantic import Field
from torch import Tensor

from attnlab.model.engine import LocalGlobal, Mask
from attnlab.parts import MaskPart, PartOptions, register
from attnlab.parts.slot_mask import needs


class LocalGlobalOptions(PartOptions):
    """A window and global tokens (at least one of ``n_global``, ``global_every``)."""

    window: int = Field(0, ge=0, description="w: keys within this distance (>= 1)")
    n_global: int = Field(0, ge=0, description="the first n tokens are global")
    global_every: int = Field(0, ge=0, description="every k-th token is global")

    def check(self, model) -> list[str]:
        if self.window < 1 or not (self.global_every or self.n_global):
            return [
                needs(self, "window >= 1 and model.mask.global_every or model.mask.n_global > 0")
            ]
        return []


@register("mask", "local_global")
class LocalGlobalMask(MaskPart):
    """A window plus global tokens."""

    cost = "params 0; pairs T (w + G)"
    #: the battery's small models (T of about 8) with a pattern that leaves keys out
    check_config = ("model.mask.window=3", "model.mask.n_global=1", "model.mask.global_every=4")
    Options = LocalGlobalOptions

    @classmethod
    def param_count(cls, opts, dims) -> int:
        return 0

    def forward(self, causal: bool, doc_ids: Tensor | None = None) -> Mask:
        o = self.opts
        return LocalGlobal(o.window, o.n_global, o.global_every, causal=causal)
