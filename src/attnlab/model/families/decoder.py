"""``decoder``: a decoder-only causal LM (GPT): one causal stack, next-token prediction.

h = Stack_causal(embed(x)); logits = h W_head^T; loss = CE over every position. Decodes token by
token with the K/V cache (when every part declares it exact), exports as a transformers causal
LM, is scored by every language-model task and timed against outside GPT implementations.
Cost per token: the stack's blocks plus the LM head (``Transformer.flops_per_token``).
"""

from __future__ import annotations

from attnlab.model.families.objectives import CAUSAL_LM
from attnlab.parts.families import register
from attnlab.parts.family import LM_ROUTE, RETRIEVAL_ROUTE, CheckCase, Family, StackPlan

#: the battery's bigbird case: windows of 2, one global token, blocks of 2, one random block
_BIGBIRD = (
    "model.attention.window=2",
    "model.attention.n_global=1",
    "model.attention.block_size=2",
    "model.attention.random_blocks=1",
    "model.attention.random_seed=3",
)


@register("decoder")
class Decoder(Family):
    """A causal LM (GPT): one causal stack ``decoder``, the next-token loss at every position.

    A family derived from it changes what differs (its objective, its checks, how it is
    scored)."""

    objective = CAUSAL_LM
    continues_text = True
    decodes_with_cache = True
    exports = True
    #: ``eval --tasks retrieval`` gives a decoder the "without retrieval" number on the same
    #: windows as a retrieval run: its baseline
    eval_routes = (LM_ROUTE, RETRIEVAL_ROUTE)
    has_peers = True
    check_cases = (
        CheckCase("causal", "learned"),
        CheckCase("prefix", "learned", ("model.attention.prefix_len=4",)),
        CheckCase("sliding", "learned", ("model.attention.window=3",)),
        CheckCase(
            "local_global",
            "learned",
            (
                "model.attention.window=3",
                "model.attention.n_global=1",
                "model.attention.global_every=4",
            ),
        ),
        CheckCase("bigbird", "learned", _BIGBIRD),
        CheckCase("causal", "none"),
        CheckCase("causal", "sinusoidal"),
        CheckCase("causal", "rope"),
        CheckCase("causal", "alibi"),
        CheckCase("causal", "t5"),
    )

    def stacks(self, cfg) -> list[StackPlan]:
        return [StackPlan("decoder", cfg.n_layers, causal=True)]

    def route(self, model, input_ids, *, cache, start_pos, return_attn, **inputs):
        return model.run_stack(
            model.decoder, input_ids, start_pos, cache=cache, return_attn=return_attn
        )

    def check(self, cfg) -> list[str]:
        if cfg.attention.mask == "bidirectional":
            return [
                f"model.family={self.name!r} is a causal LM; model.attention.mask='bidirectional' "
                "would let it see the tokens it predicts. Use family='encoder' for a "
                "bidirectional model"
            ]
        return []
