"""The four families assembled from blocks: decoder-only (causal LM), encoder-only (masked LM),
encoder-decoder (seq2seq) and retrieval (a decoder whose chosen layers read retrieved neighbours
through chunked cross-attention, ``model/retrieval/``). With ``loops > 1`` a stack is a universal transformer: its blocks are
looped ``loops`` times with shared weights and a fixed sinusoidal per-loop step signal (seed 004's
MoE-values layer is one block looped, with ``model.value.kind = "moe"``).

Init (nanoGPT / seed 001): every Linear and Embedding N(0, init_std), norm weights 1 and biases 0,
and each part initialises itself through its ``init_weights`` declaration, in module order (output
projections N(0, init_std / sqrt(2 * depth)); pre-projection 0.01, content skip 1e-4,
identity-head weights, virtual-head identity kernel, anchored query's zeroed final LN).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.base.errors import InvalidRequestError
from attnlab.config import ModelConfig
from attnlab.model.block import Block
from attnlab.model.context import AttnContext
from attnlab.model.kv_cache import KVCache
from attnlab.model.linear import Linear
from attnlab.model.linear_cross_entropy import linear_cross_entropy
from attnlab.model.masks import allowed_keys, stack_mask
from attnlab.model.output import ModelOutput
from attnlab.model.positions import SinusoidalPositions
from attnlab.model.retrieval.cca import encode_neighbours
from attnlab.parts import Dims, Init, Part, PositionPart, default_init
from attnlab.parts.registry import build


def parts_of(module: nn.Module) -> list[Part]:
    """The registered parts inside ``module``, outermost first, in module order."""
    return [m for m in module.modules() if isinstance(m, Part)]


def position_class(cfg: ModelConfig) -> type[PositionPart] | None:
    """The class of the configured position part (None: no positions, NoPE)."""
    return cfg.position_class


def norm(cfg: ModelConfig, dim: int | None = None) -> nn.Module:
    """The configured norm (``model.norm``) over ``dim`` features (default d_model)."""
    dims = Dims.from_config(cfg)
    return build(cfg.norm, dims if dim is None else dims.with_(d_model=dim), "norm")


class Stack(nn.Module):
    """Blocks of one attention direction (causal or bidirectional), with the part of the position
    slot that acts inside attention (a logit bias, a rotation), built for this direction."""

    def __init__(self, cfg: ModelConfig, n_layers: int, *, causal: bool, cross: bool) -> None:
        super().__init__()
        self.cfg, self.causal = cfg, causal
        cls = position_class(cfg)
        inside = cls is not None and (cls.logit_bias or cls.rotary)
        dims = Dims.from_config(cfg).with_(causal=causal)
        self.position = build(cfg.position, dims, "position") if inside else None
        self.loops = cfg.loops
        depth = n_layers * self.loops
        rates = [cfg.stochastic_depth * i / max(depth - 1, 1) for i in range(n_layers)]
        self.blocks = nn.ModuleList(Block(cfg, cross=cross, drop_path=r) for r in rates)
        # a fixed sinusoidal timestep signal per loop (Universal Transformers): no parameters, so
        # the parameter count does not depend on the number of loops
        sig = math.sqrt(2) * cfg.init_std  # per-dimension RMS = the embeddings' init std
        self.step_signal = SinusoidalPositions(cfg.d_model, scale=sig) if self.loops > 1 else None
        self.final_norm = norm(cfg) if cfg.norm_position == "pre" else None
        self._aux_parts = [
            p for p in parts_of(self) if type(p).pop_aux_losses is not Part.pop_aux_losses
        ]

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # checkpoints written before positions were a slot kept a relative bias as ``t5_bias``
        for key in [k for k in state_dict if k.startswith(f"{prefix}t5_bias.")]:
            state_dict[f"{prefix}position.{key[len(prefix) + 8 :]}"] = state_dict.pop(key)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @property
    def n_slots(self) -> int:
        return len(self.blocks) * self.loops

    def context(
        self,
        T: int,
        start: int,
        device: torch.device,
        need_weights: bool,
        dtype: torch.dtype = torch.float32,
        padding: Tensor | None = None,
    ) -> AttnContext:
        a = self.cfg.attention
        q_pos = torch.arange(start, start + T, device=device)
        k_pos = torch.arange(0, start + T, device=device)
        mask = stack_mask(a, self.causal)
        simple = mask in ("causal", "bidirectional")
        if simple and start == 0:
            allowed, is_causal = None, mask == "causal"
        elif simple and T == 1:
            allowed, is_causal = None, False
        else:
            allowed, is_causal = allowed_keys(a, q_pos, k_pos, self.causal), False
        bias = rotate = None
        pos = self.position
        if pos is not None and pos.logit_bias:
            bias = pos.bias(q_pos, k_pos)
        if pos is not None and pos.rotary:
            tables = pos.rotation(q_pos, dtype)
            rotate = partial(pos.rotate, tables=tables)
        return AttnContext(
            q_pos, k_pos, allowed, is_causal, bias, rotate, start, need_weights, padding
        )

    def forward(
        self,
        x: Tensor,
        ctx: AttnContext,
        *,
        cache: KVCache | None = None,
        memory: Tensor | None = None,
        after: dict[int, Callable[[Tensor], Tensor]] | None = None,
    ) -> tuple[Tensor, list[Tensor]]:
        """Run the blocks (``loops`` times when looped). Auxiliary losses of routed parts are
        summed over every pass into ``self.aux_loss`` (each loop counts as its own layer).
        ``after[i](x)`` is added to the residual stream after block i (retrieval's CCA)."""
        maps: list[Tensor] = []
        aux: list[Tensor] = []
        slot = 0
        for step in range(self.loops):
            if self.step_signal is not None:
                step_t = torch.tensor([step], device=x.device)
                x = x + self.step_signal(step_t).to(x.dtype)[0]
            for block in self.blocks:
                x, probs = block(x, ctx, cache=cache, slot=slot, memory=memory)
                if after is not None and slot in after:
                    x = x + after[slot](x)
                slot += 1
                if probs is not None:
                    maps.append(probs)
        for part in self._aux_parts:
            aux.extend(part.pop_aux_losses())
        self.aux_loss = torch.stack(aux).sum() if aux else None
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, maps


class Transformer(nn.Module):
    """Embeddings, one or two stacks, and a language-model head."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.embed = nn.Embedding(cfg.vocab_size, d)
        cls = position_class(cfg)
        #: the longest sequence the position part places (None: no limit), read once at build
        self.position_limit = cfg.position_limit
        #: the position part's embedding side (absolute positions), None when it has none
        self.abs_pos: PositionPart | None = None
        if cls is not None and cls.absolute:
            self.abs_pos = build(cfg.position, Dims.from_config(cfg), "position")
        self.drop = nn.Dropout(cfg.dropout)
        fam = cfg.family
        self.encoder = (
            Stack(cfg, cfg.n_layers, causal=False, cross=False)
            if fam in ("encoder", "encoder_decoder")
            else None
        )
        self.cca: nn.ModuleDict | None = None
        if fam == "retrieval":  # the neighbour encoder and one cross_attention part per CCA layer
            self.encoder = Stack(cfg, cfg.retrieval.encoder_layers, causal=False, cross=False)
            dims = Dims.from_config(cfg)
            self.cca = nn.ModuleDict(
                {
                    str(i): build(cfg.cross_attention, dims, "cross_attention")
                    for i in cfg.retrieval.layers(cfg.n_layers)
                }
            )
        if fam in ("decoder", "retrieval"):
            self.decoder = Stack(cfg, cfg.n_layers, causal=True, cross=False)
        elif fam == "encoder_decoder":
            self.decoder = Stack(cfg, cfg.n_decoder_layers or cfg.n_layers, causal=True, cross=True)
        else:
            self.decoder = None
        self.lm_head = Linear(d, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.reset_parameters()

    # -------------------------------------------------------------------------------- properties
    @property
    def supports_cache(self) -> bool:
        """A decoder whose every part declares cached decoding exact (retrieval decodes
        without the cache: ``model.retrieval.generate_with_retrieval``)."""
        return (
            self.decoder is not None
            and self.cca is None
            and all(type(p).supports_kv_cache for p in parts_of(self.decoder))
        )

    @property
    def needs_attention_matrix(self) -> bool:
        """True when some part reads the T x T matrix (no fused kernel: O(T^2) memory)."""
        return any(type(p).needs_attention_matrix for p in parts_of(self))

    @property
    def depth(self) -> int:
        stacks = [s for s in (self.decoder,) if s is not None] if self.cca is not None else []
        stacks = stacks or [s for s in (self.encoder, self.decoder) if s is not None]
        return max(len(s.blocks) * s.loops for s in stacks)

    # -------------------------------------------------------------------------------------- init
    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Every module in order: a part initialises itself (``init_weights``), anything else
        (embeddings, norms, positions) gets the default init."""
        init = Init.for_depth(self.cfg.init_std, self.depth)
        done: set[int] = set()
        for m in self.modules():
            if id(m) in done:
                continue
            if isinstance(m, Part):
                m.init_weights(init)
                done.update(id(s) for s in m.modules())
            else:
                default_init(m, init.std)

    # ----------------------------------------------------------------------------------- helpers
    def param_groups(self, weight_decay: float) -> list[dict]:
        """AdamW groups: decay on >= 2-D weights (matrices, embeddings), none on norms, biases and
        the parameters a part declares in ``no_decay_parameters`` (e.g. stacked expert biases)."""
        exempt = {id(p) for part in parts_of(self) for p in part.no_decay_parameters()}
        decay, no_decay = [], []
        for p in self.parameters():
            if p.requires_grad:
                wd = p.dim() >= 2 and id(p) not in exempt
                (decay if wd else no_decay).append(p)
        return [
            {"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]

    def new_cache(
        self,
        batch: int,
        max_len: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> KVCache:
        """An empty K/V cache on the model's device and in its dtype unless told otherwise."""
        if self.decoder is None:
            raise ValueError("an encoder-only model has no KV cache; it does not decode")
        p = next(self.parameters())
        return KVCache(
            self.decoder.n_slots,
            batch,
            self.cfg.n_kv_heads,
            max_len,
            self.cfg.head_dim,
            device or p.device,
            dtype or p.dtype,
        )

    def _embed(self, ids: Tensor, start: int) -> Tensor:
        x = self.embed(ids)
        end = start + ids.shape[1]
        limit = self.position_limit
        if limit is not None and end > limit:
            raise InvalidRequestError(
                f"positions up to {end - 1} exceed model.max_seq_len={limit} of "
                f"{self.cfg.position_limit_noun} (model.position.kind="
                f"{self.cfg.position.kind!r}); shorten the input, raise model.max_seq_len, or "
                "use a position part without a length limit"
            )
        if self.abs_pos is not None:
            pos = torch.arange(start, start + ids.shape[1], device=ids.device)
            x = x + self.abs_pos.embed(pos).to(x.dtype)
        return self.drop(x)

    def aux_losses(self) -> Iterator[Tensor]:
        for stack in (self.encoder, self.decoder):
            loss = getattr(stack, "aux_loss", None)
            if isinstance(loss, Tensor):
                yield loss

    def encode(self, encoder_input_ids: Tensor, need_weights: bool = False) -> Tensor:
        assert self.encoder is not None
        x = self._embed(encoder_input_ids, 0)
        ctx = self.encoder.context(x.shape[1], 0, x.device, need_weights, x.dtype)
        h, _ = self.encoder(x, ctx)
        return h

    # ----------------------------------------------------------------------------------- forward
    def forward(
        self,
        input_ids: Tensor,
        targets: Tensor | None = None,
        *,
        cache: KVCache | None = None,
        start_pos: int = 0,
        encoder_input_ids: Tensor | None = None,
        memory: Tensor | None = None,
        return_attn: bool = False,
        last_logits_only: bool = False,
        return_logits: bool = True,
        padding_mask: Tensor | None = None,
        neighbours: Tensor | None = None,
    ) -> ModelOutput:
        """Logits over the vocabulary for every position of ``input_ids`` [B, T].

        Decoder: causal LM over input_ids. Encoder: bidirectional over input_ids (masked LM).
        Encoder-decoder: ``encoder_input_ids`` (or a precomputed ``memory``) is read by the
        decoder's cross-attention; input_ids is the decoder input. ``last_logits_only`` applies
        the LM head to the last position alone (decoding reads nothing else). With targets,
        ``return_logits=False`` computes the loss by ``linear_cross_entropy`` (chunked, the
        [B, T, V] logits never materialised; ``logits`` is then None): what the trainer uses.
        ``padding_mask`` [B, T] (encoder family only; 1/True at real tokens, rows right-padded)
        masks the padded keys, so a row's real positions come out as if it were alone; a causal
        model needs none (right padding never reaches an earlier position).
        Retrieval: ``neighbours`` [B, C, k, r] token ids, the k neighbours of each chunk of
        ``model.retrieval.chunk_size`` tokens (``model/retrieval/cca.py``); None reads none (the
        CCA layers add nothing: the decoder "without retrieval").
        """
        if cache is not None:
            start_pos = cache.length
        T = input_ids.shape[1]
        if padding_mask is not None and self.cfg.family != "encoder":
            raise InvalidRequestError(
                f"padding_mask is for model.family='encoder' (this model is "
                f"{self.cfg.family!r}); a causal stack needs none for right-padded rows"
            )
        if self.cfg.family == "encoder":
            assert self.encoder is not None
            x = self._embed(input_ids, 0)
            pad = None if padding_mask is None else padding_mask.to(torch.bool)
            ctx = self.encoder.context(T, 0, x.device, return_attn, x.dtype, pad)
            h, maps = self.encoder(x, ctx)
        else:
            assert self.decoder is not None
            if self.cfg.family == "encoder_decoder" and memory is None:
                if cache is not None and cache.cross:
                    memory = None
                else:
                    if encoder_input_ids is None:
                        raise ValueError("an encoder-decoder model needs encoder_input_ids")
                    memory = self.encode(encoder_input_ids)
            after = None
            if neighbours is not None and self.cca is not None:
                if cache is not None or start_pos:
                    raise InvalidRequestError(
                        "a retrieval model reads its neighbours over the whole sequence; call "
                        "it without a cache (model.retrieval.generate_with_retrieval does)"
                    )
                enc = encode_neighbours(self, neighbours)
                after = {int(i): (lambda h, c=c: c(h, enc)) for i, c in self.cca.items()}
            x = self._embed(input_ids, start_pos)
            ctx = self.decoder.context(T, start_pos, x.device, return_attn, x.dtype)
            h, maps = self.decoder(x, ctx, cache=cache, memory=memory, after=after)
        if cache is not None:
            cache.length = start_pos + T
        fused_loss = targets is not None and not return_logits  # also under torch.compile
        logits = None if fused_loss else self.lm_head(h[:, -1:] if last_logits_only else h)
        loss = None
        if fused_loss:
            assert self.lm_head.bias is None
            loss = linear_cross_entropy(h, self.lm_head.weight, targets, ignore_index=-100)
        elif targets is not None:
            loss = F.cross_entropy(
                logits.view(-1, logits.shape[-1]).to(
                    torch.promote_types(logits.dtype, torch.float32)
                ),
                targets.reshape(-1),
                ignore_index=-100,
            )
        aux = list(self.aux_losses()) if self.training else []
        return ModelOutput(
            logits=logits,
            loss=loss,
            aux_loss=torch.stack(aux).sum() if aux else None,
            cache=cache,
            attn=maps if return_attn else None,
        )

    # --------------------------------------------------------------------------------- accounting
    def flops_per_token(self, seq_len: int) -> int:
        """Forward FLOPs per token: each part's declared ``flops_per_token`` (by default 2 x
        every Linear it holds; a routed part counts only active experts; a score part adds its
        own work), 2 x any other Linear, plus 4 * T * d_h per head per attention layer for
        q k^T and p v at full context T (the PaLM/nanoGPT convention), the LM head included.
        Training costs 3x this."""
        from attnlab.model.attention_layer import Attention

        total = 0
        for stack in (self.encoder, self.decoder):
            if stack is None:
                continue
            scale, T = 1.0, seq_len
            if self.cca is not None and stack is self.encoder:
                # retrieval: k neighbours of r tokens are encoded per chunk of m decoder tokens
                r = self.cfg.retrieval
                scale, T = r.neighbours * r.neighbour_len / r.chunk_size, r.neighbour_len
            stack_total = 0
            for block in stack.blocks:
                per_block, done = 0, set()
                for m in block.modules():
                    if id(m) in done:
                        continue
                    if isinstance(m, Part):
                        per_block += m.flops_per_token(seq_len)
                        done.update(id(s) for s in m.modules())
                    elif isinstance(m, nn.Linear):
                        per_block += 2 * m.in_features * m.out_features
                    if isinstance(m, Attention):
                        per_block += 4 * T * m.dh * m.heads_out
                stack_total += per_block * stack.loops
            total += round(stack_total * scale)
        if self.cca is not None:  # each cross_attention part declares its own (K/V per neighbour)
            total += sum(c.flops_per_token(seq_len) for c in self.cca.values())
        total += 2 * self.lm_head.in_features * self.lm_head.out_features
        return total


def build_model(cfg: ModelConfig) -> Transformer:
    """Build the model a config describes."""
    return Transformer(cfg)
