"""A prefix LM as a model family of its own; use it with --plugin examples/prefix_lm.py.

One stack whose first P tokens (model.attention.prefix_len) read each other both ways and whose
later tokens read only what came before (the "prefix" mask), trained on the tokens after the
prefix only: the prefix is the condition, as in T5's prefix LM (Raffel et al. 2020, §3.2.1) and
UniLM. Everything else is the decoder's: the stack, the route, the K/V cache, the export.

    [model]
    family = "prefix_lm"
    attention.prefix_len = 16        # P; the mask is "prefix" unless you set another (refused)
"""

import numpy as np

from attnlab.model.families.decoder import Decoder
from attnlab.parts import CheckCase, Objective, register_family


class PrefixLMObjective(Objective):
    """Targets after the prefix: position t predicts x_{t+1}, and for t < P - 1 that token is
    inside the prefix, which t reads both ways, so its target is ignored (-100)."""

    name = "prefix_lm"

    def batch(self, x, y, rng, *, vocab, mask_prob, eos_id, model=None):
        targets = np.array(y, dtype=np.int64)
        targets[:, : model.attention.prefix_len - 1] = -100
        return {"input_ids": x, "targets": targets}


@register_family("prefix_lm")
class PrefixLM(Decoder):
    """A prefix LM: the first P tokens read each other both ways, the loss covers the rest."""

    objective = PrefixLMObjective()
    has_peers = False  # the outside GPTs of `attnlab bench` are causal everywhere
    check_cases = (CheckCase("prefix", "learned", ("model.attention.prefix_len=4",)),)

    def settle(self, table):
        attention = table.get("attention", {})
        if isinstance(attention, dict) and "mask" not in attention:
            return {**table, "attention": {**attention, "mask": "prefix"}}
        return table

    def check(self, cfg):
        if cfg.attention.mask != "prefix":
            return [
                f"model.family={self.name!r} reads its prefix both ways; set "
                f"model.attention.mask='prefix' (not {cfg.attention.mask!r})"
            ]
        return []

    def score_logits(self, model, input_ids, scored_from=0):
        """Position t < P - 1 would see x_{t+1} in the prefix: its logits come from the
        sequence cut after t instead (a prefix of the t + 1 tokens there are), so every
        position reads only tokens <= t. Cost: a forward of t + 1 tokens per such position
        read (from ``scored_from`` on)."""
        logits = model(input_ids).logits
        for t in range(scored_from, min(model.cfg.attention.prefix_len - 1, input_ids.shape[1])):
            logits[:, t] = model(input_ids[:, : t + 1], last_logits_only=True).logits[:, -1]
        return logits
