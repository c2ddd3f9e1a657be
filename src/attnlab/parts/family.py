"""The family contract: a model assembly registered by name, as a part is.

A family (``model.family``) says once what a model of it is, and every command asks it instead of
comparing names (torchtitan's ``TrainSpec`` registers a model with its builders the same way).
A family is a :class:`Family` subclass registered with ``@register_family("name")``
(:mod:`attnlab.parts.families`); the built-in ones are the modules of ``attnlab.model.families``
and a researcher's own is one file loaded with ``--plugin FILE.py`` or ``plugins = [...]``.

=========================  =====================================================================
declaration                what reads it
=========================  =====================================================================
``stacks(cfg)``            the model: its stacks (:class:`StackPlan`: name, depth, direction,
                           cross-attention) in build order; ``attnlab params``, FLOPs, the init
``build(model, cfg)``      the model: builds the stacks (and modules of its own, e.g. CCA)
``route(model, ids, ...)`` the model's forward: embeddings -> its stacks -> hidden states
``objective``              ``attnlab train``: how a token window becomes inputs and targets
                           (an :class:`Objective`: causal LM, masked LM, span corruption, ...)
``data_needs``             train, eval, generate, bench: data beside the tokens
                           (:data:`NEIGHBOURS`: retrieved chunks from the retrieval database)
``causal_lm``              inspect, the check battery, parts' checks: position t predicts token
                           t + 1 from tokens <= t (False: an encoder's own-token predictions)
``continues_text``         ``generate`` and ``bench``: it continues a prompt on its own
``decodes_with_cache``     the model and the battery: token-by-token decoding with the K/V cache
``exports``                ``attnlab export``: a transformers ``AutoModelForCausalLM`` folder
``eval_routes``            ``attnlab eval``: :data:`LM_ROUTE` (perplexity, cloze, multiple
                           choice through ``score_logits``), :data:`RETRIEVAL_ROUTE` (the loss
                           with and without neighbours)
``takes_padding_mask``     the model and the battery: right-padded rows through ``padding_mask``
``reads_cross_attention``  the config: whether ``model.cross_attention`` is read
``has_peers``              ``bench``: outside GPT implementations of the same shape exist
``check(cfg)``             the config: impossible combinations, one sentence each
``settle(table)``          the config: defaults a raw ``[model]`` table takes before validation
``check_cases``            ``attnlab check``: the small models (:class:`CheckCase`) it is
                           checked in, at 10 tokens in models of 16 positions
``check_inputs``           ``attnlab check``: the model's inputs beside the tokens
``alone_inputs``           ``inspect``: the inputs of a forward over one sequence alone
``score_logits``           ``attnlab eval``: logits where position t depends on tokens <= t
``param_rows``             ``attnlab params``: its own rows for whole modules (a stack)
``notes``, ``card_lines``  ``attnlab params`` notes; ``attnlab export``'s model card section
=========================  =====================================================================

``register_family`` refuses a family whose declarations cannot be used (no objective, an unknown
data need or evaluation route, no ``stacks``), naming them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from torch import Tensor

#: a data need: the retrieved neighbours of every chunk (``attnlab data retrieval``)
NEIGHBOURS = "neighbours"
DATA_NEEDS = (NEIGHBOURS,)
#: evaluation routes: the language-model tasks (perplexity, cloze, multiple choice) and the
#: validation loss with and without neighbours (``attnlab eval --tasks retrieval``)
LM_ROUTE = "lm"
RETRIEVAL_ROUTE = "retrieval"
EVAL_ROUTES = (LM_ROUTE, RETRIEVAL_ROUTE)


@dataclass(frozen=True)
class StackPlan:
    """One stack of blocks a family builds.

    - ``name``: the model attribute it is built as (``"decoder"``, ``"encoder"``): checkpoint
      keys start with it, so a family that changes it changes its checkpoints;
    - ``n_layers``: blocks (each run ``model.loops`` times); ``causal``: reads only earlier
      tokens (with ``model.attention.mask``'s pattern) or both ways; ``cross``: its blocks
      cross-attend to ``memory`` (an encoder-decoder's decoder);
    - ``in_depth``: counts in the depth that scales the output projections' init (False: a
      side stack such as retrieval's neighbour encoder);
    - ``tokens_per_token``, ``length``: for FLOPs, the tokens it processes per model token and
      the sequence length its attention sees (None: the model's).
    """

    name: str
    n_layers: int
    causal: bool
    cross: bool = False
    in_depth: bool = True
    tokens_per_token: float = 1.0
    length: int | None = None

    def describe(self) -> str:
        """``decoder (causal, cross-attending)``: for messages."""
        how = ["causal" if self.causal else "bidirectional"]
        return f"{self.name} ({', '.join(how + (['cross-attending'] if self.cross else []))})"


@dataclass(frozen=True)
class CheckCase:
    """A small model the check battery builds in a family: its mask, its position part (the
    battery's position check replaces it) and further ``--set`` overrides."""

    mask: str
    position: str
    overrides: tuple[str, ...] = ()


class Objective:
    """How a family trains: a batch of token windows ``x`` [n, T] and their next tokens ``y``
    [n, T] (NumPy int64) become the model's inputs and targets (ignored targets are -100).

    ``corrupts``: it draws from ``rng`` (seeded by seed, step and micro-batch, so a resumed or
    split run corrupts every window as an uninterrupted one); ``extra_ids``: ids it uses above
    the tokenizer's vocabulary (a mask id, sentinels), which ``model.vocab_size`` must hold.
    """

    #: its name (``train.objective``, the run's status and logs)
    name: ClassVar[str] = ""
    corrupts: ClassVar[bool] = False

    def extra_ids(self, seq_len: int, mask_prob: float) -> int:
        return 0

    def batch(
        self,
        x: np.ndarray,
        y: np.ndarray,
        rng: np.random.Generator | None,
        *,
        vocab: int,
        mask_prob: float,
        eos_id: int | None,
        model: Any = None,
    ) -> dict[str, np.ndarray]:
        """``{"input_ids", "targets", ...}``: the forward's keyword inputs (e.g.
        ``encoder_input_ids``) beside them; ``model`` is the :class:`ModelConfig`."""
        raise NotImplementedError


class Family:
    """A model assembly: what a model of this family is (see the module docstring).

    Built-in families are ``attnlab.model.families.*``; a family of one's own usually derives
    from one of them (``attnlab.model.families.decoder.Decoder``) and changes what differs.
    """

    #: its name in ``model.family`` (set by ``register_family``)
    name: ClassVar[str] = ""
    objective: ClassVar[Objective]
    data_needs: ClassVar[tuple[str, ...]] = ()
    causal_lm: ClassVar[bool] = True
    continues_text: ClassVar[bool] = False
    decodes_with_cache: ClassVar[bool] = False
    exports: ClassVar[bool] = False
    eval_routes: ClassVar[tuple[str, ...]] = ()
    takes_padding_mask: ClassVar[bool] = False
    reads_cross_attention: ClassVar[bool] = False
    has_peers: ClassVar[bool] = False
    check_cases: ClassVar[tuple[CheckCase, ...]] = ()
    #: ``attnlab params`` rows of whole modules of the model (a stack, a module it builds) by
    #: their attribute name, e.g. ``{"encoder": "neighbour_encoder"}``
    param_rows: ClassVar[dict[str, str]] = {}

    # ------------------------------------------------------------------------- assembly
    def stacks(self, cfg: Any) -> list[StackPlan]:
        """Its stacks in build order for ``cfg`` (a ``ModelConfig``)."""
        raise NotImplementedError

    def build(self, model: Any, cfg: Any) -> None:
        """Build the stacks on ``model`` (``model.add_stack(plan)``) and any module of its own;
        modules are built (and initialised) in the order they are added."""
        for plan in self.stacks(cfg):
            model.add_stack(plan)

    def route(
        self,
        model: Any,
        input_ids: Tensor,
        *,
        cache: Any,
        start_pos: int,
        return_attn: bool,
        **inputs: Any,
    ) -> tuple[Tensor, list[Tensor]]:
        """(hidden states [B, T, d] for the LM head, attention maps) of ``input_ids`` [B, T];
        ``inputs`` are the forward's other keyword inputs that were given (e.g. ``memory``,
        ``neighbours``, ``padding_mask``)."""
        raise NotImplementedError

    def extra_flops(self, model: Any, seq_len: int) -> int:
        """Forward FLOPs per token of modules it builds outside its stacks."""
        return 0

    # ----------------------------------------------------------------------------- config
    def check(self, cfg: Any) -> list[str]:
        """Impossible combinations with the rest of ``cfg`` (a ``ModelConfig``), one sentence
        each naming the keys and the fix."""
        return []

    def settle(self, table: Mapping[str, Any]) -> Mapping[str, Any]:
        """A raw ``[model]`` table with the defaults this family gives before validation."""
        return table

    # ------------------------------------------------------------------- what reads it
    def alone_inputs(self, x: Tensor) -> dict[str, Any]:
        """The forward's inputs beside ``x`` when ``x`` is all there is (``attnlab inspect``)."""
        return {}

    def check_inputs(self, x: Tensor, enc: Tensor | None, cfg: Any) -> dict[str, Any]:
        """The battery's inputs beside ``x`` for a model of ``cfg`` (a ``ModelConfig``); ``enc``
        is a sequence of its own for a family that reads a second one (default: ``x``)."""
        return self.alone_inputs(x if enc is None else enc)

    def score_logits(self, model: Any, input_ids: Tensor, scored_from: int = 0) -> Tensor:
        """Logits [B, T, V] in which position t depends only on tokens <= t of its row, for the
        language-model tasks (rows are right-padded); positions before ``scored_from`` are not
        read (a family that pays for a position's scoring may skip them)."""
        return model(input_ids).logits

    def notes(self, cfg: Any) -> list[str]:
        return []

    def card_lines(self, cfg: Any) -> list[str]:
        return []

    def needs(self, what: str) -> bool:
        """Whether it reads ``what`` beside the tokens (e.g. :data:`NEIGHBOURS`)."""
        return what in self.data_needs

    def evaluates(self, route: str) -> bool:
        return route in self.eval_routes

    # -------------------------------------------------------------------- registration
    @classmethod
    def declaration_problems(cls) -> list[str]:
        """Why the class cannot be used as declared (empty when it can)."""
        out = []
        if not isinstance(getattr(cls, "objective", None), Objective):
            out.append("objective must be an Objective instance (how it trains)")
        elif not cls.objective.name.isidentifier():
            out.append(f"{type(cls.objective).__name__}.name must be an identifier")
        if cls.stacks is Family.stacks:
            out.append("it implements no stacks(cfg)")
        if cls.route is Family.route:
            out.append("it implements no route(model, input_ids, ...)")
        for what, got, known in (
            ("data_needs", cls.data_needs, DATA_NEEDS),
            ("eval_routes", cls.eval_routes, EVAL_ROUTES),
        ):
            bad = [n for n in got if n not in known]
            if bad:
                out.append(f"{what} {bad} are not among {list(known)}")
        if cls.exports and not cls.continues_text:
            out.append("exports = True needs continues_text = True (a causal LM export)")
        return out
