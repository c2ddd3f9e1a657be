"""What each attention mask needs of ``[model.attention]`` (a window, global tokens, a prefix),
checked when the config loads. Kept apart from the other checks: masks become parts with their
own checks in the attention-engine issue, and these move into them."""

from __future__ import annotations

from typing import Any


def mask_problems(attention: Any) -> list[str]:
    """The problems of ``attention`` (a :class:`~attnlab.config.AttentionConfig`): the options
    its ``mask`` needs, and a mask the flash kernel cannot take."""
    a, problems = attention, []
    if a.backend == "flash" and a.mask not in ("causal", "bidirectional"):
        problems.append(
            f"model.attention.mask='{a.mask}' needs an explicit mask, which the flash kernel "
            "does not take; set model.attention.backend='auto'"
        )
    if a.mask == "sliding" and a.window < 1:
        problems.append("model.attention.mask='sliding' needs model.attention.window >= 1")
    if a.mask == "local_global" and (a.window < 1 or not (a.global_every or a.n_global)):
        problems.append(
            "model.attention.mask='local_global' needs model.attention.window >= 1 and "
            "model.attention.global_every or model.attention.n_global > 0"
        )
    if a.mask == "bigbird" and (a.window < 1 or a.random_blocks < 1):
        problems.append(
            "model.attention.mask='bigbird' needs model.attention.window >= 1 and "
            "model.attention.random_blocks >= 1 (global tokens: n_global / global_every)"
        )
    if a.mask == "prefix" and a.prefix_len < 1:
        problems.append("model.attention.mask='prefix' needs model.attention.prefix_len >= 1")
    return problems
