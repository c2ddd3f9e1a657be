"""The ``mask`` slot's contract: which keys each query may see, as the attention engine's mask.

Kept beside :mod:`attnlab.parts.slots` (which lists the slot) because the mask is the one slot
whose parts return a declaration rather than a tensor: the engine's ``Mask`` (``mask_mod`` in
FlexAttention's convention plus structure hints, ``docs/attention-engine.md``).
"""

from __future__ import annotations

from typing import ClassVar

from attnlab.base.schema import PartOptions
from attnlab.parts.part import Part


class MaskPart(Part):
    """``mask``: which keys each query may see. ``forward(causal: bool, doc_ids: Tensor | None)
    -> Mask`` returns the attention engine's :class:`~attnlab.model.engine.Mask` (a ``mask_mod``
    in FlexAttention's convention plus structure hints, ``docs/attention-engine.md``) for a
    stack of that direction (an encoder-decoder's encoder is bidirectional, its decoder
    causal). ``doc_ids`` [B, T] is the document of each position of a packed row (None: one
    document per row), passed only to a part declaring ``needs_doc_ids``. The model calls it
    once per forward and stack; the engine evaluates the mask where it gathers keys, and the
    explicit path forms its dense [Tq, Tk] pattern from the same ``mask_mod``.

    Declarations read: ``direction`` ("causal": only in a causal stack, e.g. prefix;
    "bidirectional": only in a bidirectional one; None: either, following the stack),
    ``plain`` (the mask is exactly the stack's own direction, SDPA's ``is_causal`` or no mask:
    the flash kernel and ``score.virtual_heads_fused`` take only these), ``decoder_only``
    (meaningful in a decoder-only LM alone: an encoder-decoder refuses it), ``needs_doc_ids``,
    ``prompt_problem(opts, prompt_len) -> str | None`` (a prompt ``generate`` cannot start from).
    """

    direction: ClassVar[str | None] = None
    plain: ClassVar[bool] = False
    unchecked: ClassVar[dict[str, str]] = {
        "effect": "a mask part returns the engine's mask, not a tensor to perturb; its pattern "
        "is proven by causality, kv_cache, batch and fused",
    }
    decoder_only: ClassVar[bool] = False
    needs_doc_ids: ClassVar[bool] = False

    @classmethod
    def prompt_problem(cls, opts: PartOptions, prompt_len: int) -> str | None:
        return None


def needs(opts: PartOptions, what: str) -> str:
    """A mask option's refusal: ``model.mask.kind='sliding' needs model.mask.window >= 1``."""
    return f"model.mask.kind={opts.kind!r} needs model.mask.{what}"
