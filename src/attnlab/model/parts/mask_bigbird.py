"""BigBird (Zaheer et al. 2020): local + global, plus for each query block of ``block_size``
tokens ``random_blocks`` key blocks drawn at random (in a causal stack among the blocks before
it). The draw of query block b comes from a generator seeded by (``random_seed``, b) alone, so
the pattern of a position never depends on the sequence length: a run, its resume, the KV cache
and an export see the same keys.

No params; O(T (w + G + r B)) pairs, gathered block by block (the layout block is the random
pattern's ``block_size``).
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field
from torch import Tensor

from attnlab.base.section import seed_type
from attnlab.model.engine import BigBird, Mask
from attnlab.model.parts.mask_local_global import LocalGlobalOptions
from attnlab.parts import MaskPart, register
from attnlab.parts.slot_mask import needs


class BigBirdOptions(LocalGlobalOptions):
    """Local + global, and the random blocks (global tokens optional here)."""

    block_size: int = Field(16, ge=1, description="tokens per block of the random pattern")
    random_blocks: int = Field(0, ge=0, description="random key blocks per query block (>= 1)")
    random_seed: seed_type("seed of the random blocks (stored: run, resume, export agree)") = 0

    def check(self, model) -> list[str]:  # global tokens optional: the random blocks connect
        if self.window < 1 or self.random_blocks < 1:
            return [
                needs(
                    self,
                    "window >= 1 and model.mask.random_blocks >= 1 (global tokens: n_global / "
                    "global_every)",
                )
            ]
        return []


@register("mask", "bigbird")
class BigBirdMask(MaskPart):
    """A window, global tokens and seeded random key blocks."""

    cost = "params 0; pairs T (w + G + r B)"
    unchecked: ClassVar[dict[str, str]] = {
        **MaskPart.unchecked,
        "batch": "its random key blocks are drawn for the sequence's length (seeded by "
        "random_seed and T), so a right-padded row gets another pattern than the row alone; rows "
        "of one length are independent of their batch (model/masks.py's tests)",
    }
    #: the battery's small models (T of about 8) with a pattern that leaves keys out
    check_config = ("model.mask.window=2", "model.mask.random_blocks=1", "model.mask.block_size=2")
    Options = BigBirdOptions

    @classmethod
    def param_count(cls, opts, dims) -> int:
        return 0

    def forward(self, causal: bool, doc_ids: Tensor | None = None) -> Mask:
        o = self.opts
        return BigBird(
            o.window,
            o.n_global,
            o.global_every,
            block_size=o.block_size,
            random_blocks=o.random_blocks,
            seed=o.random_seed,
            causal=causal,
        )
