"""The base every part derives from, and what a part is given when it is built.

A part is an ``nn.Module`` registered in a slot under a kind name (``@register("query",
"nonlinear")``). It declares, on the class, everything the rest of attnlab needs to know about
it, so that the block, ``attnlab params``, the FLOP counter, the optimizer, ``generate``, the
reports and the probe read declarations instead of naming parts:

=========================  =====================================================================
declaration                what reads it
=========================  =====================================================================
``Options``                the config: the part's typed options (a :class:`PartOptions` subclass)
``param_label``            ``attnlab params``: the row its parameters are counted in
``cost``                   ``attnlab parts``: its parameter/FLOP/cache cost in symbols
``param_count``            ``attnlab check``: its parameter count by formula, from (opts, dims)
``flops_per_token``        MFU and ``attnlab params`` (default: 2 x in x out of its Linears)
``extra_flops``            FLOPs a part adds beyond its Linears (e.g. a convolution over scores)
``init_weights``           the model's init (default: Linear N(0, std), norms 1, biases 0)
``no_decay_parameters``    the optimizer: parameters kept out of weight decay
``pop_aux_losses``         the training loss: auxiliary losses of the last forward
``supports_kv_cache``      ``generate``: whether cached decoding is exact with this part
``needs_attention_matrix`` the attention core: whether the T x T matrix must be formed
``layer_stats``            reports: per-layer numbers read from the trained weights
``forward_stats``          reports: per-layer summaries of one recorded forward pass
``train_stats``            the run loop: numbers logged every ``train.log_every`` steps (to
                           ``metrics.jsonl`` as ``part/KEY/LAYER`` and to every tracker)
``token_stats``            ``attnlab inspect``: per-token values of one recorded forward pass
``attention_rows``         ``attnlab inspect``: a score part's maps for some query rows only
``attention_maps_label``   reports: draw this variant's attention maps, with this label
``notes``                  ``attnlab params``: sentences about sizing choices
``probe_name``             ``attnlab probe``: the part's name in method strings
``probe_ready``            ``attnlab probe``: whether it can be injected (in a slot the probe injects)
``width_option``           ``compare``'s parameter matching: the option that sets its width
``width_scaling``          µP (``attnlab.model.mup``): how its parameters scale with width, where
                           their shapes do not say it (``attnlab.parts.width``)
``check_config``           ``attnlab check``: settings its small models need (``model.mlp=false``)
``unchecked``              ``attnlab check``: properties that do not apply to it, and why
``quantizable``            ``attnlab quantize``: the Linears whose weights may be stored in low
                           precision (default: its own Linears of >= ``QUANT_MIN_FEATURES``
                           inputs and outputs; small gates and routers stay exact)
``full_precision_notes``   ``attnlab quantize``: why it keeps a weight in full precision (the
                           kept list of a quantized model names the reason)
``tp_plan``                ``--tp N``: which Linears split column- or row-wise over the ranks,
                           which own tensors split along which dimension, or why the part is
                           replicated (default: replicated, :data:`attnlab.parts.tp.NO_PLAN`)
=========================  =====================================================================

``register`` refuses a class whose declarations would leave it unused (``declaration_problems``:
no ``forward``; a position part that declares no way into the model, or implements a method it
does not declare; a score part whose ``transform`` has no valid ``on``; a norm without
``reset_norm``), naming the declarations, so nothing registered is dropped without a word.

FLOPs are matmul FLOPs (the PaLM/nanoGPT convention, what ``torch.utils.flop_counter`` counts):
elementwise work (activations, norms, softmax, a tanh on the scores) counts none.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from attnlab.base.params import n_params
from attnlab.base.schema import DEFAULT_INIT_STD, PartOptions
from attnlab.parts.tp import NO_PLAN, TPPlan
from attnlab.parts.width import WidthScaling

#: ``Part.quantizable``'s default size: a Linear with fewer inputs or outputs than this (a gate,
#: a router over a few experts, a per-head scale) keeps full precision. Such a layer is cheap
#: (its bytes are a rounding error next to a d x 4d projection) and its outputs decide discrete
#: choices (routing, gating) that an int8/int4 rounding error could flip.
QUANT_MIN_FEATURES = 32


@dataclass(frozen=True)
class Dims:
    """The shapes and shared settings a part is built for (``Part(opts, dims)``).

    - ``d_model``: d, the width of the residual stream, of x^, x~ and of every block output;
    - ``n_heads``: H, the query heads; ``n_kv_heads``: H_kv, the key/value heads (divides H);
      ``head_dim``: d_h; properties ``d_q`` = H d_h and ``d_kv`` = H_kv d_h, the widths the
      query and the key/value parts return;
    - ``n_layers``: the model's depth (layers built, not counting loops);
    - ``bias``: whether the model's Linear layers have biases (``model.bias``);
      ``norm_eps``, ``norm_bias``: the model's norm settings, for a part's own norms;
    - ``cross``: True for the parts of a cross-attention layer (encoder-decoder);
    - ``pretrained``: True when the part is injected into a pretrained Hugging Face model by the
      probe (the base keeps its own projections; ``model`` is then None);
    - ``heads_out``: H', the heads leaving the score slot: H until the score part is built,
      then its ``heads_out(opts, dims)`` for the readout and the mixer;
    - ``mixer_in``: n_in, the width the readout hands the mixer: H d_h until the readout is
      built, then its ``width(opts, dims)`` for the mixer;
    - ``model``: the whole :class:`~attnlab.config.ModelConfig` in an attnlab model (None in
      the probe), for anything else a part needs to read;
    - ``causal``: whether the stack the part is built for reads only earlier tokens (False in an
      encoder; a position part's bias may differ by direction).
    """

    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_layers: int = 1
    bias: bool = False
    norm_eps: float = 1e-5
    norm_bias: bool = True
    cross: bool = False
    pretrained: bool = False
    heads_out: int = 0
    mixer_in: int = 0
    model: Any = None
    causal: bool = True

    @property
    def d_q(self) -> int:
        """Width of all query heads together, H * d_h."""
        return self.n_heads * self.head_dim

    @property
    def d_kv(self) -> int:
        """Width of all key (or value) heads together, H_kv * d_h."""
        return self.n_kv_heads * self.head_dim

    def with_(self, **changes: Any) -> Dims:
        return replace(self, **changes)

    @classmethod
    def from_config(cls, cfg: Any, *, cross: bool = False) -> Dims:
        """The dims of an attnlab :class:`~attnlab.config.ModelConfig`."""
        H = cfg.attention.n_heads
        return cls(
            d_model=cfg.d_model,
            n_heads=H,
            n_kv_heads=cfg.n_kv_heads,
            head_dim=cfg.head_dim,
            n_layers=cfg.n_layers,
            bias=cfg.bias,
            norm_eps=getattr(cfg.norm, "eps", 1e-5),
            norm_bias=getattr(cfg.norm, "bias", True),
            cross=cross,
            heads_out=H,
            mixer_in=H * cfg.head_dim,
            model=cfg,
        )


@dataclass(frozen=True)
class Init:
    """The model-wide init a part is asked to apply: weights N(0, ``std``), output projections
    (the last matrix of a branch that adds into the residual stream) N(0, ``out_std``) with
    ``out_std = std / sqrt(2 * depth)`` (GPT-2 / nanoGPT)."""

    std: float = DEFAULT_INIT_STD
    out_std: float = DEFAULT_INIT_STD

    @classmethod
    def for_depth(cls, std: float, depth: int) -> Init:
        return cls(std=std, out_std=std / math.sqrt(2 * depth))


@torch.no_grad()
def default_init(module: nn.Module, std: float) -> None:
    """Initialise one module (not its children): Linear and Embedding weights N(0, std) with zero
    biases; a norm (a module with ``reset_norm()``, as attnlab's norms have) to its identity
    settings: gain 1 (ScaleNorm: sqrt(d)) and bias 0. Other modules are left alone."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, 0.0, std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, 0.0, std)
    elif callable(getattr(module, "reset_norm", None)):
        module.reset_norm()


class Part(nn.Module):
    """Base of every registered part (see the module docstring for its declarations)."""

    #: the typed options of this part; a subclass without options inherits its parent's
    Options: ClassVar[type[PartOptions]] = PartOptions
    #: set by ``register``: the slot and the kind name this class is registered under
    slot: ClassVar[str] = ""
    kind: ClassVar[str] = ""
    #: the ``attnlab params`` row of this part's parameters (None = the slot's name)
    param_label: ClassVar[str | None] = None
    #: cost in symbols, shown by ``attnlab parts`` (params, FLOPs per token, K/V-cache bytes)
    cost: ClassVar[str] = ""
    supports_kv_cache: ClassVar[bool] = True
    needs_attention_matrix: ClassVar[bool] = False
    #: report label of a variant whose attention maps are worth drawing (None: not this part)
    attention_maps_label: ClassVar[str | None] = None
    #: the name of this part in probe method strings (None = its kind), e.g. "preproj"
    probe_name: ClassVar[str | None] = None
    #: the integer option that sets this part's width, which parameter matching may resize
    width_option: ClassVar[str | None] = None
    #: ``--set`` overrides the conformance check (``attnlab check``) builds its small models with,
    #: for a part that needs them (e.g. ``("model.mlp=false",)`` for a mixer sized to the MLP)
    check_config: ClassVar[tuple[str, ...]] = ()
    #: conformance properties that do not apply to this part -> the sentence saying why; the
    #: check reports them as skipped with that reason (names: ``attnlab.testing.PROPERTIES``)
    unchecked: ClassVar[dict[str, str]] = {}

    def __init__(self, opts: PartOptions, dims: Dims) -> None:
        super().__init__()
        self.opts = opts
        #: what the part was built for (read by ``param_count`` checks and reports)
        self.dims = dims

    @classmethod
    def declaration_problems(cls) -> list[str]:
        """Sentences naming what in this class's declarations would leave it unused, or unable to
        run, in its slot; ``register`` refuses a class with any (empty: none). A slot's contract
        class adds its own rules (a position part must declare how it enters the model)."""
        if _implements(cls, "forward", nn.Module):
            return []
        return [
            "it implements no forward(...), and the model calls a part's forward (the slot's "
            "contract class says what it is given and must return)"
        ]

    @classmethod
    def probe_ready(cls) -> bool:
        """Whether ``attnlab probe`` can inject this part into a pretrained model, given that its
        slot is one the probe injects (``Slot.probe``); a slot's contract may ask for more."""
        return True

    # ------------------------------------------------------------------------------- accounting
    @classmethod
    def label(cls) -> str:
        return cls.param_label or cls.slot

    @classmethod
    def param_count(cls, opts: PartOptions, dims: Dims) -> int | None:
        """Parameters a part built with ``opts`` for ``dims`` holds, by its formula (the one its
        docstring and ``cost`` state); ``attnlab check`` compares it with the real count.
        None: not declared (the check says so and skips the comparison)."""
        return None

    @classmethod
    def activation_elements(cls, opts: PartOptions, dims: Dims, seq_len: int) -> int:
        """Tensor elements per token and layer a forward of this part holds at once beyond its
        Linears' outputs and the attention matrix (a padded copy, a convolution's input), at
        context length ``seq_len``: the memory preflight adds them, so a size option (a kernel
        size, a window) that would exhaust memory is refused before anything is allocated.
        Default 0."""
        return 0

    def flops_per_token(self, seq_len: int) -> int:
        """Forward FLOPs per token: 2 x in x out of every Linear inside, plus ``extra_flops``."""
        lin = sum(
            2 * m.in_features * m.out_features for m in self.modules() if isinstance(m, nn.Linear)
        )
        return lin + self.extra_flops(seq_len)

    def extra_flops(self, seq_len: int) -> int:
        """FLOPs per token beyond the Linears (at context length ``seq_len``)."""
        return 0

    def active_params(self) -> int:
        """Parameters a token passes through (a routed part uses only some of them)."""
        return n_params(self)

    def notes(self) -> list[str]:
        """Sentences for ``attnlab params`` about how this part sized itself."""
        return []

    # ------------------------------------------------------------------------------------ init
    def init_weights(self, init: Init) -> None:
        """Initialise this part's weights (called by the model's ``reset_parameters`` in module
        order). Default: every Linear/Embedding N(0, init.std), norms 1, biases 0."""
        for m in self.modules():
            default_init(m, init.std)

    def width_scaling(self) -> dict[str, WidthScaling]:
        """µP: parameter name (relative to this part) -> how it scales with width, for those its
        shape does not say (:mod:`attnlab.parts.width`); the rest are inferred. Default: none."""
        return {}

    # ---------------------------------------------------------------------------- optimisation
    def no_decay_parameters(self) -> Iterable[nn.Parameter]:
        """Parameters of >= 2 dims that must not be weight-decayed (e.g. stacked biases)."""
        return ()

    def pop_aux_losses(self) -> list[Tensor]:
        """Auxiliary losses from the forwards since the last call (weighted, ready to add)."""
        return []

    # ---------------------------------------------------------------------------------- reports
    def layer_stats(self) -> dict[str, float]:
        """Numbers read from this layer's trained weights, for the reports (e.g. a norm)."""
        return {}

    @classmethod
    def layer_stats_doc(cls, opts: PartOptions, d_model: int) -> dict[str, str]:
        """One sentence per ``layer_stats`` key: what it measures and its value at init."""
        return {}

    def record(self, on: bool) -> None:
        """Keep (``on``) or stop keeping what ``forward_stats`` reports of each forward."""
        self._recording = on

    @property
    def recording(self) -> bool:
        return self.__dict__.get("_recording", False)

    def forward_stats(self) -> dict[str, Tensor]:
        """Summaries of the last forward while recording, e.g. mean head weights [H+1]."""
        return {}

    @classmethod
    def forward_stats_doc(cls) -> dict[str, tuple[str, list[str] | None]]:
        """Per ``forward_stats`` key: (a sentence for the report, bar labels or None)."""
        return {}

    def train_stats(self) -> dict[str, float | Tensor]:
        """Numbers to follow over training, read by the run loop every ``train.log_every`` steps
        (after the optimizer step), e.g. a weight's norm or a gate's value, or a summary the part
        kept (detached, a few numbers) of its last training forward. They become the
        ``metrics.jsonl`` columns ``part/KEY/LAYER`` (LAYER counts this part's class in module
        order) and ``part/KEY`` (their mean over layers), and the same scalars in every tracker.
        Keep it cheap: it runs during training; a 0-d tensor is read with one ``float()``."""
        return {}

    @classmethod
    def train_stats_doc(cls) -> dict[str, str]:
        """One sentence per ``train_stats`` key: what it measures and its value at init."""
        return {}

    def token_stats(self) -> dict[str, Tensor]:
        """Per-token values of the last forward while recording, for the first sequence:
        KEY -> [T, n] (n columns, e.g. the identity head's weights over the H' + 1 heads, or a
        router's probabilities over the experts); ``attnlab inspect`` draws them per token."""
        return {}

    @classmethod
    def token_stats_doc(cls) -> dict[str, tuple[str, list[str] | None]]:
        """Per ``token_stats`` key: (a sentence for the page, the n column labels or None)."""
        return {}

    # ------------------------------------------------------------------------------ quantization
    def quantizable(self) -> dict[str, nn.Linear]:
        """The Linears whose weights ``attnlab quantize`` may store as int8/int4 (name relative to
        this part -> module). Default: this part's own ``nn.Linear`` modules (not those of a part
        nested inside it, which declares its own) with at least ``QUANT_MIN_FEATURES`` inputs and
        outputs. Everything else (norms, biases, a part's own tensors such as gates, scales and
        mixing matrices, small Linears) stays in full precision. A part overrides this to keep a
        Linear whose weight it reads directly (not through ``F.linear``) or that its math needs
        exact, and says why in ``full_precision_notes``. Cost: a walk over its modules."""
        return {
            name: m
            for name, m in own_linears(self).items()
            if min(m.in_features, m.out_features) >= QUANT_MIN_FEATURES
        }

    def full_precision_notes(self) -> dict[str, str]:
        """Why this part keeps a weight in full precision: parameter or module name (relative to
        the part) -> a sentence, shown in a quantized model's kept list. Default: none (the
        kept list then gives the generic reason: a norm, a small Linear, the part's own tensor)."""
        return {}

    # ------------------------------------------------------------------------ tensor parallel
    def tp_plan(self) -> TPPlan:
        """How this part splits over the ranks of a ``tp`` mesh (``--tp N``): its Linears'
        styles (column- or row-wise), its own tensors' split dimension, or why it cannot be split
        (:class:`~attnlab.parts.tp.TPPlan`; what a split means per slot is in
        :mod:`attnlab.parts.tp`). Default: replicated (held and computed whole on every rank:
        always correct, without the memory saving; in the attention path its heads are gathered
        from the ranks first)."""
        return TPPlan.whole(NO_PLAN)

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}"


def own_linears(part: nn.Module) -> dict[str, nn.Linear]:
    """The ``nn.Linear`` modules inside ``part`` that no part nested in it owns (name relative
    to ``part`` -> module)."""
    nested = [n for n, m in part.named_modules() if n and isinstance(m, Part)]
    return {
        name: m
        for name, m in part.named_modules()
        if isinstance(m, nn.Linear) and not any(name.startswith(f"{p}.") for p in nested)
    }


def _implements(cls: type, method: str, base: type) -> bool:
    """Whether ``cls`` (or a class between it and ``base``) defines ``method`` itself."""
    return getattr(cls, method, None) is not getattr(base, method, None)
