"""A model: embeddings, the stacks its family builds (:mod:`attnlab.model.families`:
decoder-only, encoder-only, encoder-decoder, retrieval, or a plugin's), and a language-model
head. The family says which stacks there are and routes the forward through them; this module
holds what every family shares (embeddings, the LM head and its loss, the cache, the init, the
optimizer groups, FLOPs). With ``loops > 1`` a stack is a universal transformer
(``model/stack.py``).

Init (nanoGPT / seed 001): every Linear and Embedding N(0, init_std), norm weights 1 and biases 0,
and each part initialises itself through its ``init_weights`` declaration, in module order (output
projections N(0, init_std / sqrt(2 * depth)); pre-projection 0.01, content skip 1e-4,
identity-head weights, virtual-head identity kernel, anchored query's zeroed final LN).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from attnlab.base.errors import InvalidRequestError
from attnlab.config import ModelConfig
from attnlab.model.kv_cache import KVCache
from attnlab.model.linear import Linear
from attnlab.model.linear_cross_entropy import linear_cross_entropy
from attnlab.model.output import ModelOutput
from attnlab.model.stack import Stack, norm, parts_of, position_class
from attnlab.parts import Dims, Init, Part, PositionPart, default_init, families
from attnlab.parts.family import StackPlan
from attnlab.parts.registry import build

__all__ = ["Stack", "Transformer", "build_model", "norm", "parts_of", "position_class"]


class Transformer(nn.Module):
    """Embeddings, the stacks of ``model.family`` (``self.family``, a registered
    :class:`~attnlab.parts.family.Family`), and a language-model head.

    A stack is the attribute its :class:`~attnlab.parts.family.StackPlan` names (``encoder``,
    ``decoder``; ``None`` when the family has none); ``stack_plans`` lists the family's plans in
    build order. The stack that decodes (and holds the K/V cache) is ``decoder``.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.family = families.of(cfg)
        d = cfg.d_model
        self.embed = nn.Embedding(cfg.vocab_size, d)
        cls = position_class(cfg)
        #: the longest sequence the position part places (None: no limit), read once at build
        self.position_limit = cfg.position_limit
        #: the mask part's class (its prompt rule), read once here: decoding looks nothing up
        self.mask_class = cfg.mask_class
        #: the position part's embedding side (absolute positions), None when it has none
        self.abs_pos: PositionPart | None = None
        if cls is not None and cls.absolute:
            self.abs_pos = build(cfg.position, Dims.from_config(cfg), "position")
        self.drop = nn.Dropout(cfg.dropout)
        self.encoder: Stack | None = None
        self.decoder: Stack | None = None
        #: retrieval's chunked cross-attention parts by decoder layer (None in other families)
        self.cca: nn.ModuleDict | None = None
        self.stack_plans: list[StackPlan] = []
        self.family.build(self, cfg)
        self.lm_head = Linear(d, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.reset_parameters()

    #: ranks of the ``tp`` mesh this model is split over (``model.tensor_parallel``); 1: whole
    tp_size: int = 1

    def add_stack(self, plan: StackPlan) -> Stack:
        """Build the stack ``plan`` describes as the attribute it names (families call this)."""
        stack = Stack(self.cfg, plan.n_layers, causal=plan.causal, cross=plan.cross)
        setattr(self, plan.name, stack)
        self.stack_plans.append(plan)
        return stack

    def stacks(self) -> list[tuple[StackPlan, Stack]]:
        """(plan, stack) of every stack, in build order."""
        return [(plan, getattr(self, plan.name)) for plan in self.stack_plans]

    # -------------------------------------------------------------------------------- properties
    @property
    def supports_cache(self) -> bool:
        """A family that decodes with the cache (``decodes_with_cache``) whose decoder's every
        part, and every part that reads the decoder's stream (retrieval's cross-attention),
        declares cached decoding exact."""
        readers = parts_of(self.cca) if self.cca is not None else []
        return (
            self.family.decodes_with_cache
            and self.decoder is not None
            and all(type(p).supports_kv_cache for p in [*parts_of(self.decoder), *readers])
        )

    @property
    def needs_attention_matrix(self) -> bool:
        """True when some part reads the T x T matrix (no fused kernel: O(T^2) memory)."""
        return any(type(p).needs_attention_matrix for p in parts_of(self))

    @property
    def depth(self) -> int:
        """Layers run by the deepest stack that counts in the depth (``StackPlan.in_depth``)."""
        return max(len(s.blocks) * s.loops for plan, s in self.stacks() if plan.in_depth)

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
        groups = [
            {"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        plan = getattr(self, "mup_plan", None)
        if plan is None:
            return groups
        from attnlab.model.mup.groups import split_groups  # µP: learning rates per width role

        return split_groups(self, plan, groups)

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
            self.cfg.n_kv_heads // self.tp_size,  # under tensor parallelism: the rank's KV heads
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
        for _, stack in self.stacks():
            loss = getattr(stack, "aux_loss", None)
            if isinstance(loss, Tensor):
                yield loss

    def run_stack(
        self,
        stack: Stack,
        input_ids: Tensor,
        start_pos: int = 0,
        *,
        cache: KVCache | None = None,
        return_attn: bool = False,
        padding: Tensor | None = None,
        memory: Tensor | None = None,
        after: dict[int, Callable[[Tensor], Tensor]] | None = None,
        doc_ids: Tensor | None = None,
    ) -> tuple[Tensor, list[Tensor]]:
        """(hidden states, attention maps) of ``input_ids`` [B, T] at positions ``start_pos``..
        through ``stack``: the embeddings, the stack's mask and positions, its blocks (a family's
        route is made of these calls)."""
        x = self._embed(input_ids, start_pos)
        T = input_ids.shape[1]
        ctx = stack.context(T, start_pos, x.device, return_attn, x.dtype, padding, doc_ids)
        return stack(x, ctx, cache=cache, memory=memory, after=after)

    def encode(self, encoder_input_ids: Tensor, need_weights: bool = False) -> Tensor:
        """The ``encoder`` stack's output over ``encoder_input_ids`` (an encoder-decoder's
        memory, retrieval's encoded neighbours)."""
        assert self.encoder is not None
        h, _ = self.run_stack(self.encoder, encoder_input_ids, return_attn=need_weights)
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
        doc_ids: Tensor | None = None,
    ) -> ModelOutput:
        """Logits over the vocabulary for every position of ``input_ids`` [B, T], through the
        route of the model's family (:meth:`~attnlab.parts.family.Family.route`).

        Decoder: causal LM over input_ids. Encoder: bidirectional over input_ids (masked LM).
        Encoder-decoder: ``encoder_input_ids`` (or a precomputed ``memory``) is read by the
        decoder's cross-attention; input_ids is the decoder input. ``last_logits_only`` applies
        the LM head to the last position alone (decoding reads nothing else). With targets,
        ``return_logits=False`` computes the loss by ``linear_cross_entropy`` (chunked, the
        [B, T, V] logits never materialised; ``logits`` is then None): what the trainer uses.
        ``padding_mask`` [B, T] (families that declare ``takes_padding_mask``: the encoder; 1/True
        at real tokens, rows right-padded) masks the padded keys, so a row's real positions come
        out as if it were alone; a causal model needs none (right padding never reaches an
        earlier position). Retrieval: ``neighbours`` [B, C, k, r] token ids, the k neighbours of
        each chunk of ``model.retrieval.chunk_size`` tokens (``model/retrieval/cca.py``); None
        reads none (the CCA layers add nothing: the decoder "without retrieval"). ``doc_ids``
        [B, T]: the packed document of each position, for a mask part that declares
        ``needs_doc_ids`` (the training batch carries them; None: one document per row).
        """
        if cache is not None:
            start_pos = cache.length
        T = input_ids.shape[1]
        if padding_mask is not None and not self.family.takes_padding_mask:
            raise InvalidRequestError(
                f"padding_mask is for {families.where(lambda f: f.takes_padding_mask)} (this "
                f"model is {self.cfg.family!r}); a causal stack needs none for right-padded rows"
            )
        given = {
            "encoder_input_ids": encoder_input_ids,
            "memory": memory,
            "padding_mask": padding_mask,
            "neighbours": neighbours,
            "doc_ids": doc_ids,
        }
        h, maps = self.family.route(
            self,
            input_ids,
            cache=cache,
            start_pos=start_pos,
            return_attn=return_attn,
            **{k: v for k, v in given.items() if v is not None},
        )
        if cache is not None:
            cache.length = start_pos + T
        fused_loss = targets is not None and not return_logits  # also under torch.compile
        logits = None if fused_loss else self.lm_head(h[:, -1:] if last_logits_only else h)
        loss = None
        if fused_loss:
            assert self.lm_head.bias is None
            weight = self.lm_head.weight
            if isinstance(weight, DTensor):  # split over a tp mesh: the chunked loss reads all
                weight = weight.full_tensor()
            loss = linear_cross_entropy(h, weight, targets, ignore_index=-100)
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
        for plan, stack in self.stacks():
            # a stack may process more tokens than the model reads (retrieval's encoder: k
            # neighbours of r tokens per chunk of m) and see another length
            T = plan.length or seq_len
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
            total += round(stack_total * plan.tokens_per_token)
        total += self.family.extra_flops(self, seq_len)
        total += 2 * self.lm_head.in_features * self.lm_head.out_features
        return total


def build_model(cfg: ModelConfig) -> Transformer:
    """Build the model a config describes (µP applied when ``cfg.parametrisation`` says so).

    The floating-point mode goes back to torch's default first: an earlier model's score mods in
    this process may have flushed denormals (``engine.denormals``), and a run's numbers must not
    depend on what ran before it (compare trains its runs in one process with ``--jobs 1``)."""
    from attnlab.model.engine.denormals import reset_denormals
    from attnlab.model.mup.apply import apply_configured

    reset_denormals()

    model = Transformer(cfg)
    apply_configured(model, cfg)
    return model
