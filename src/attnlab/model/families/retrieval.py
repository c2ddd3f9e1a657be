"""``retrieval``: a retrieval-augmented decoder (RETRO, Borgeaud et al. 2022).

A causal decoder whose chosen layers (``model.retrieval.cca_layers``) add chunked
cross-attention (the ``cross_attention`` slot's part, ``cca`` by default) to k retrieved
neighbours of r tokens per chunk of m tokens, each encoded by a bidirectional neighbour encoder
sharing the embeddings:

    E = Stack_bidirectional(embed(neighbours))           [B, C, k r, d]
    h_i = Block_i(h_{i-1}) + CCA_i(h, E)  at the CCA layers; h = Block_i(h_{i-1}) elsewhere

``neighbours`` [B, C, k, r] token ids come from the retrieval database (``attnlab data
retrieval``); without them the CCA layers add nothing (the decoder "without retrieval"). No K/V
cache (CCA's memory grows with every completed chunk): generation retrieves live, running full
forwards. Cost per token: the decoder, the encoder at k r / m tokens per decoder token, each CCA
part's own (K/V over the neighbours), the LM head.
"""

from __future__ import annotations

import torch
from torch import nn

from attnlab.base.errors import InvalidRequestError
from attnlab.model.families.objectives import CAUSAL_LM
from attnlab.model.retrieval.cca import encode_neighbours
from attnlab.parts import Dims
from attnlab.parts.families import register
from attnlab.parts.family import NEIGHBOURS, RETRIEVAL_ROUTE, CheckCase, Family, StackPlan
from attnlab.parts.registry import build

#: the battery's case: chunks of 5 tokens (10 / 5 = 2 chunks), 2 neighbours of 5 + 2 tokens, CCA
#: after layer 1, and 15 training positions (a multiple of the chunk)
_CASE = (
    "model.retrieval.chunk_size=5",
    "model.retrieval.neighbours=2",
    "model.retrieval.continuation=2",
    "model.retrieval.cca_layers=[1]",
    "data.seq_len=15",
)


@register("retrieval")
class Retrieval(Family):
    """A retrieval decoder (RETRO): a causal ``decoder`` whose CCA layers read k neighbours per
    chunk through a bidirectional neighbour ``encoder``.

    ``model.cca`` holds one ``cross_attention`` part per CCA layer (built between the two
    stacks)."""

    objective = CAUSAL_LM
    data_needs = (NEIGHBOURS,)
    continues_text = True
    exports = True
    eval_routes = (RETRIEVAL_ROUTE,)
    reads_cross_attention = True
    param_rows = {"cca": "chunked_cross_attention", "encoder": "neighbour_encoder"}  # noqa: RUF012
    check_cases = (CheckCase("causal", "learned", _CASE),)

    def stacks(self, cfg) -> list[StackPlan]:
        r = cfg.retrieval
        encoder = StackPlan(
            "encoder",
            r.encoder_layers,
            causal=False,
            in_depth=False,  # the output projections' init scales with the decoder's depth
            tokens_per_token=r.neighbours * r.neighbour_len / r.chunk_size,
            length=r.neighbour_len,
        )
        return [encoder, StackPlan("decoder", cfg.n_layers, causal=True)]

    def build(self, model, cfg) -> None:
        encoder, decoder = self.stacks(cfg)
        model.add_stack(encoder)
        dims = Dims.from_config(cfg)
        model.cca = nn.ModuleDict(
            {
                str(i): build(cfg.cross_attention, dims, "cross_attention")
                for i in cfg.retrieval.layers(cfg.n_layers)
            }
        )
        model.add_stack(decoder)

    def route(self, model, input_ids, *, cache, start_pos, return_attn, neighbours=None, **_):
        after = None
        if neighbours is not None:
            if cache is not None or start_pos:
                raise InvalidRequestError(
                    "a retrieval model reads its neighbours over the whole sequence; call "
                    "it without a cache (model.retrieval.generate_with_retrieval does)"
                )
            enc = encode_neighbours(model, neighbours)
            after = {int(i): (lambda h, c=c: c(h, enc)) for i, c in model.cca.items()}
        return model.run_stack(
            model.decoder,
            input_ids,
            start_pos,
            cache=cache,
            return_attn=return_attn,
            after=after,
        )

    def extra_flops(self, model, seq_len: int) -> int:
        """Each cross_attention part declares its own (K/V per neighbour)."""
        return sum(c.flops_per_token(seq_len) for c in model.cca.values())

    # ----------------------------------------------------------------------------- config
    def settle(self, table):
        """A retrieval config from before the ``cross_attention`` slot names no part: ``cca``."""
        part = table.get("cross_attention")
        if part is None or (isinstance(part, dict) and "kind" not in part):
            return {**table, "cross_attention": {"kind": "cca", **(part or {})}}
        return table

    def check(self, cfg) -> list[str]:
        """CCA layers that exist, a causal mask, a plain residual stack, a cross_attention part."""
        problems = []
        bad = [i for i in cfg.retrieval.layers(cfg.n_layers) if not 0 <= i < cfg.n_layers]
        if bad:
            problems.append(
                f"model.retrieval.cca_layers={bad} are not layers of a {cfg.n_layers}-layer "
                f"decoder; use indices 0..{cfg.n_layers - 1}"
            )
        if cfg.attention.mask == "bidirectional":
            problems.append(
                f"model.family={self.name!r} is a causal LM; use model.attention.mask='causal'"
            )
        if cfg.loops != 1 or cfg.residual_kind == "parallel" or not cfg.residual:
            problems.append(
                f"model.family={self.name!r} is built for loops=1, residual=true and "
                "residual_kind='sequential'"
            )
        if cfg.cross_attention.kind == "none":
            problems.append(
                f"model.family={self.name!r} reads its neighbours through a cross_attention "
                "part; set model.cross_attention.kind='cca' (or a plugin's kind)"
            )
        return problems

    # -------------------------------------------------------------------- what reads it
    def check_inputs(self, x, enc, cfg):
        """Neighbours that are a fixed function of each chunk's own tokens (as a database
        lookup is), so the causality check also proves the cross_attention part's shift: a
        part that lets a token read the neighbours of a chunk it has not finished seeing reads
        tokens after it."""
        r, vocab = cfg.retrieval, cfg.vocab_size
        m, k, n = r.chunk_size, r.neighbours, r.neighbour_len
        B, T = x.shape
        C = T // m
        chunks = x[:, : C * m].reshape(B, C, 1, m)
        s = torch.arange(n, device=x.device)
        i = torch.arange(k, device=x.device).view(1, 1, k, 1)
        return {"neighbours": (chunks[..., s % m] * (i + 2) + s + 7 * i) % vocab}

    def notes(self, cfg) -> list[str]:
        r = cfg.retrieval
        return [
            f"retrieval: chunked cross-attention after decoder layers "
            f"{r.layers(cfg.n_layers)}, chunks of {r.chunk_size} tokens, {r.neighbours} "
            f"neighbours of {r.neighbour_len} tokens through a {r.encoder_layers}-layer encoder; "
            "the database is data, not parameters (`attnlab data retrieval` prints its size, "
            "a run's status.json records it)"
        ]

    def card_lines(self, cfg) -> list[str]:
        """What a retrieval model expects at its input (its database is not exported)."""
        r = cfg.retrieval
        return [
            "## Retrieval (not in this folder)",
            "",
            f"A RETRO-style decoder: chunked cross-attention after decoder layers "
            f"{r.layers(cfg.n_layers)} reads, for every chunk of {r.chunk_size} tokens, "
            f"{r.neighbours} neighbours of {r.neighbour_len} tokens (a retrieved chunk and its "
            f"continuation) through a {r.encoder_layers}-layer encoder. The retrieval database "
            "is not exported: pass `neighbours=` (token ids [batch, chunks, "
            f"{r.neighbours}, {r.neighbour_len}]) to `forward`, chunk j's neighbours retrieved "
            "with chunk j's tokens (attnlab builds them with `attnlab data retrieval`: BM25 "
            "over the training split's chunks). Without `neighbours` (and so in `generate()` "
            "and pipelines) the model runs as its decoder without retrieval.",
            "",
        ]
