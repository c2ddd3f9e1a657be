"""``encoder``: an encoder-only masked LM (BERT): one bidirectional stack.

h = Stack_bidirectional(embed(x~)), x~ = x with 15% of positions hidden (80% mask id, 10% a
random token, 10% kept); the loss covers the hidden positions only, each predicting its own
token. Right-padded rows are masked with ``padding_mask``. It neither decodes nor exports.
Cost per token: the stack's blocks plus the LM head.
"""

from __future__ import annotations

import torch

from attnlab.model.families.objectives import MASKED_LM
from attnlab.parts.families import register
from attnlab.parts.family import CheckCase, Family, StackPlan


@register("encoder")
class Encoder(Family):
    """A masked LM (BERT): one bidirectional stack ``encoder``, the loss at the hidden
    positions."""

    objective = MASKED_LM
    causal_lm = False
    takes_padding_mask = True
    check_cases = (
        CheckCase("bidirectional", "learned"),
        CheckCase("sliding", "rope", ("model.attention.window=3",)),
        CheckCase("bidirectional", "t5"),
    )

    def stacks(self, cfg) -> list[StackPlan]:
        return [StackPlan("encoder", cfg.n_layers, causal=False)]

    def route(self, model, input_ids, *, cache, start_pos, return_attn, padding_mask=None, **_):
        pad = None if padding_mask is None else padding_mask.to(torch.bool)
        return model.run_stack(model.encoder, input_ids, 0, return_attn=return_attn, padding=pad)

    def check(self, cfg) -> list[str]:
        mask = cfg.attention.mask
        if mask in ("causal", "prefix"):
            return [
                f"model.family={self.name!r} is bidirectional; model.attention.mask='{mask}' "
                "would hide the right context. Use 'bidirectional', 'sliding' or 'local_global'"
            ]
        return []
