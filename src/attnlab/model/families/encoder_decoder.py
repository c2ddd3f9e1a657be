"""``encoder_decoder``: a seq2seq model (T5): a bidirectional encoder over ``encoder_input_ids``
and a causal decoder whose blocks cross-attend to the encoder's output (``memory``).

memory = Stack_bidirectional(embed(e)); h = Stack_causal+cross(embed(x), memory). Trained with
span corruption (the encoder reads the window with spans replaced by sentinels, the decoder
writes the spans). The decoder decodes with the K/V cache (its cross-attention keys cached
too); it does not continue a prompt on its own (it needs an encoder input), so it is not
generated from, benchmarked or exported. Cost per token: both stacks plus the LM head.
"""

from __future__ import annotations

from attnlab.model.families.objectives import SPAN_CORRUPTION
from attnlab.parts.families import register
from attnlab.parts.family import CheckCase, Family, StackPlan


@register("encoder_decoder")
class EncoderDecoder(Family):
    """A seq2seq model (T5): a bidirectional ``encoder`` (``model.n_layers``) read by a causal,
    cross-attending ``decoder`` (``model.n_decoder_layers``); span corruption."""

    objective = SPAN_CORRUPTION
    decodes_with_cache = True
    check_cases = (CheckCase("causal", "learned", ("model.n_decoder_layers=2",)),)

    def stacks(self, cfg) -> list[StackPlan]:
        return [
            StackPlan("encoder", cfg.n_layers, causal=False),
            StackPlan("decoder", cfg.n_decoder_layers or cfg.n_layers, causal=True, cross=True),
        ]

    def route(
        self,
        model,
        input_ids,
        *,
        cache,
        start_pos,
        return_attn,
        memory=None,
        encoder_input_ids=None,
        **_,
    ):
        if memory is None and not (cache is not None and cache.cross):
            if encoder_input_ids is None:
                raise ValueError("an encoder-decoder model needs encoder_input_ids")
            memory = model.encode(encoder_input_ids)
        return model.run_stack(
            model.decoder,
            input_ids,
            start_pos,
            cache=cache,
            return_attn=return_attn,
            memory=memory,
        )

    def alone_inputs(self, x):
        return {"encoder_input_ids": x}

    def check(self, cfg) -> list[str]:
        out = []
        if cfg.n_decoder_layers is None:
            out.append(f"model.family={self.name!r} needs model.n_decoder_layers")
        if cfg.residual_kind == "parallel":
            out.append(
                "model.residual_kind='parallel' has no place for cross-attention; use "
                f"residual_kind='sequential' with model.family={self.name!r}"
            )
        if cfg.attention.mask == "prefix":
            out.append(
                "model.attention.mask='prefix' is for decoder-only prefix LMs; an "
                "encoder-decoder already reads its input bidirectionally"
            )
        return out
