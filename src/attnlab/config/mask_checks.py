"""What the mask part (``[model.mask]``) needs of the rest of the model config, checked when it
loads; each mask's own options are validated by its part's options class, and what a family
needs of a mask it reads from the part's declarations (``direction``, ``decoder_only``)."""

from __future__ import annotations

from typing import Any


def mask_problems(model: Any) -> list[str]:
    """The problems of ``model`` (a :class:`~attnlab.config.ModelConfig`) with its mask: a mask
    that is not the stack's plain pattern cannot run on the flash kernel."""
    cls = model.mask_class
    if model.attention.backend == "flash" and not cls.plain:
        return [
            f"model.mask.kind='{model.mask.kind}' needs an explicit mask, which the flash kernel "
            "does not take; set model.attention.backend='auto'"
        ]
    return []


def direction_problems(
    model: Any, family: str, causal: bool, *, encoder_decoder: bool
) -> list[str]:
    """A mask the family's stacks cannot use: one meant for the other direction, or a
    decoder-only mask (a prefix) in an encoder-decoder (whose decoder keeps its causal mask
    whatever the kind: a full mask there is its encoder's)."""
    cls, kind = model.mask_class, model.mask.kind
    if encoder_decoder and cls.decoder_only:
        return [
            f"model.mask.kind='{kind}' is for decoder-only prefix LMs; an encoder-decoder already "
            "reads its input bidirectionally"
        ]
    if causal and cls.direction == "bidirectional" and not encoder_decoder:
        return [
            f"model.family={family!r} is a causal LM; model.mask.kind='{kind}' would let it "
            "see the tokens it predicts. Use family='encoder' for a bidirectional model"
        ]
    if not causal and cls.direction == "causal":
        return [
            f"model.family={family!r} is bidirectional; model.mask.kind='{kind}' would hide "
            "the right context. Use 'full', 'sliding' or 'local_global'"
        ]
    return []
