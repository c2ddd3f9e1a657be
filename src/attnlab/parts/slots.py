"""The named slots of a block and the contract of each (the base class a part in it derives from).

Read in the order of the seed figures::

    x^ = Norm(x)
    x~ = feature_map(x^)                      pre-attention feature map (optional)
    q, k, v = query(x~), key(x~), value(x~)   projections (fused into one matmul when all can)
    heads = score(q, k, v)                    attention core, or a part that rewrites the scores
    o = readout(x~, heads)                    head readout: [B,H',T,d_h] -> [B,T,n_in]
    a = mixer(o)                              head mixing, n_in -> d
    h = x + a + side_branch(x~)               a branch beside attention (optional)
    y = h + ffn(Norm(h))                      feed-forward

Each contract class below says exactly what the assembly (``model/block.py``,
``model/attention_layer.py``, ``model/attention.py``) passes a part of its slot and what it
expects back; this file is the source of truth, and ``docs/CONTRACTS.md`` repeats it. A part
implements ``forward`` and may implement the optional methods it can support (a query part that
only has ``forward`` works: it is simply not fused with K and V).

Shapes: B batch, T positions of this call (Tq queries; Tk keys, which include the KV cache while
decoding, so Tk >= Tq and the queries are the last Tq positions), d = ``dims.d_model``,
H = ``dims.n_heads``, H_kv = ``dims.n_kv_heads`` (H_kv divides H: GQA/MQA), d_h =
``dims.head_dim``, H' = ``dims.heads_out`` (the heads leaving the score slot), n_in =
``dims.mixer_in``. Every part is built as ``Part(opts, dims)`` (:class:`~attnlab.parts.part.Dims`
holds these sizes and when each is set), once per layer (a looped model runs its layers again).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import Field
from torch import Tensor

from attnlab.base.schema import PartOptions
from attnlab.parts.part import Part, _implements
from attnlab.parts.slot_mask import MaskPart
from attnlab.parts.slot_position import PositionPart
from attnlab.parts.tp import TPPlan

FusedRows = list[tuple[Tensor, Tensor | None]]
#: what a score part's transform may rewrite (``ScorePart.on``)
ON = ("logits", "probs")
#: the kind of an empty optional slot
NONE_KIND = "none"


class ProjectionPart(Part):
    """A projection of x~ that may join the fused Q/K/V matmul (the query, key and value slots).

    ``forward(u [B,T,d]) -> [B,T,width]``, ``u`` = x~ (in cross-attention: the decoder stream for
    the query, the encoder output [B,S,d] for key and value). Optional fusion: when the query,
    key and value parts all return their weight rows from ``fused_weights()`` ([(W [r, d],
    b [r] or None), ...], ``fused_width`` = the total r) and ``model.attention.fuse_qkv`` is on,
    one matmul u [W_q | W_k | W_v]^T runs for the three, and ``finish(u, part [B,T,r])`` turns
    this part's slice into its output (the default returns the slice). The default
    ``fused_weights()`` is None: the part cannot be fused, and all three then run their own
    ``forward``.
    """

    def fused_weights(self) -> FusedRows | None:
        return None

    @property
    def fused_width(self) -> int:
        rows = self.fused_weights()
        return sum(w.shape[0] for w, _ in rows) if rows else 0

    def finish(self, u: Tensor, part: Tensor) -> Tensor:
        return part


class QueryPart(ProjectionPart):
    """``query``: q = Q(x~), ``forward(u [B,T,d]) -> [B,T,H*d_h]`` (exactly ``dims.d_q`` wide:
    the attention views it as H heads of d_h, then applies qk-norm and rotary positions).

    ``scale_multiplier`` (read once, when the layer is built) multiplies the softmax scale
    1/sqrt(d_h) (a part may realise a constant factor on q there instead). On a pretrained
    model (``dims.pretrained``, the probe) the base keeps its W_Q and ``pretrained_delta(u
    [B,T,d], q_base [B,T,H*d_h]) -> [B,T,H*d_h]`` is what the part adds to the base's query;
    a query part without it cannot be probed.
    """

    scale_multiplier: float = 1.0

    def pretrained_delta(self, u: Tensor, q_base: Tensor) -> Tensor:
        raise NotImplementedError

    @classmethod
    def probe_ready(cls) -> bool:
        """A query part can be probed only when it implements ``pretrained_delta``."""
        return cls.pretrained_delta is not QueryPart.pretrained_delta


class KeyPart(ProjectionPart):
    """``key``: k = K(x~), ``forward(u [B,T,d]) -> [B,T,H_kv*d_h]`` (``dims.d_kv`` wide; viewed
    as H_kv heads, then qk-norm, rotary, and the KV cache: what this part returns is cached)."""


class ValuePart(ProjectionPart):
    """``value``: v = V(x~), ``forward(u [B,T,d]) -> [B,T,H_kv*d_h]`` (``dims.d_kv`` wide;
    viewed as H_kv heads and cached like the keys). A routed part hands its auxiliary losses
    to training through ``pop_aux_losses``."""


class ScorePart(Part):
    """``score``: how per-head scores become head outputs (self-attention only; cross-attention
    has no score part).

    ``forward(q [B,H,Tq,d_h], k [B,H_kv,Tk,d_h], v [B,H_kv,Tk,d_h], core, ctx) -> (heads
    [B,H',Tq,d_h], probs [B,H',Tq,Tk] or None)``. q and k come after qk-norm and rotary, k and v
    with the cached positions in front (one-token decoding: Tq = 1, Tk = the whole prefix).
    ``core`` is the layer's :class:`~attnlab.model.attention.AttentionCore` (``core.scale`` =
    the query part's ``scale_multiplier`` / sqrt(d_h), ``core.dropout``, ``core.backend``);
    ``ctx`` the call's :class:`ScoreContext`. ``probs`` are the attention maps, needed when
    ``ctx.need_weights`` (``return_attn``, the reports' maps); otherwise None is fine.

    A part calls one of the core's two paths:

    - ``core.sdpa(q, k, v, ctx, scale=None) -> out [B,H,Tq,d_h]``: fused attention (no T x T
      matrix, O(T) memory), ``ctx``'s mask, bias and padding applied, GQA handled, ``scale``
      replacing ``core.scale`` (e.g. 1 for queries the part has already scaled);
    - ``core.explicit(q, k, v, ctx, transform=self) -> (out [B,H',Tq,d_h], probs
      [B,H',Tq,Tk])``: the materialised matrix, rewritten by the part. It computes, in order:

      1. ``allowed``: ``ctx.allowed``, or the causal (``ctx.is_causal``: key j <= query i +
         Tk - Tq) or full [Tq,Tk] pattern; with ``ctx.padding`` [B,1,Tq,Tk], padded keys masked;
      2. k repeated to H heads (GQA); ``scores = (q * core.scale) @ k^T`` [B,H,Tq,Tk], plus
         ``ctx.bias`` [H,Tq,Tk] (ALiBi, T5) when present;
      3. ``on == "logits"``: masked entries are set to 0 (not -inf, so a convolution reads
         finite numbers), then ``scores = transform(scores, allowed)`` [B,H',Tq,Tk], then the
         masked entries are set to the dtype's minimum and a softmax over keys gives probs;
      4. ``on == "probs"``: softmax over keys first (masked entries excluded; padded query rows
         zeroed), then ``probs = transform(probs, allowed)`` [B,H',Tq,Tk], masked entries set
         to 0 and each row renormalised to sum 1 (rows that sum to 0 stay 0);
      5. masked entries of probs set to 0, attention dropout (training), v repeated to H' heads
         (so H' must be a multiple of H_kv), ``out = probs @ v``.

    **Declared instead of a forward** (the fused way, ``docs/attention-engine.md``): a part
    whose change is elementwise implements ``score_mods() -> tuple[ScoreMod, ...]`` (the
    attention engine's ``score_mod(score, b, h, q_idx, kv_idx)`` objects, FlexAttention's
    convention, with the folds they may declare: a per-head scale, a bias) and/or
    ``normaliser() -> Normaliser`` (replacing the softmax), and no ``forward``: the layer then
    runs the engine with the position part's mods, then these, then the mask, then the
    normaliser, on the fastest exact path (fused SDPA when everything folds, block-sparse SDPA,
    flex, or the explicit path for a mod with no fused form where flex cannot run), and the
    check battery proves the fused path equals the explicit one.

    So a transform never needs to mask: what it writes at masked entries is discarded. It must
    keep causality in a causal stack: output (i, j) may read only rows <= i (row i' > i holds a
    later token's query); reading other keys of the same row is safe, masked ones read as 0
    (logits) or 0 (probs). While decoding with the cache it sees only the new rows, so a part
    whose transform reads earlier rows must declare ``supports_kv_cache = False``.

    Declarations read: ``on`` ("logits" or "probs", when it passes ``transform=self``),
    ``transform(scores, allowed) -> scores'``, ``heads_out(opts, dims) -> H'`` (a classmethod,
    read before the readout and mixer are built: they get it as ``dims.heads_out``; default
    H), ``needs_attention_matrix`` (True when ``forward`` always forms the T x T matrix: the
    config then refuses ``model.attention.backend`` flash/sdpa, and ``attnlab bench`` marks it
    O(T^2 H)), ``extra_flops(seq_len)`` for what the transform adds.
    """

    #: what ``transform`` rewrites when ``forward`` passes ``transform=self`` to
    #: ``core.explicit``: "logits" or "probs" (None: no transform, or set per instance from the
    #: options, as ``virtual_heads`` does; core.explicit refuses any other value)
    on: ClassVar[str | None] = None

    @classmethod
    def declaration_problems(cls) -> list[str]:
        out = super().declaration_problems() if not cls.declares() else []
        if not cls.declares() and not _implements(cls, "forward", ScorePart):
            out.append(
                "it implements neither forward(q, k, v, core, ctx) nor score_mods() / "
                "normaliser(), so it would change nothing"
            )
        on = cls.on  # None: set per instance from its options (or no transform at all)
        if _implements(cls, "transform", ScorePart) and on is not None and on not in ON:
            out.append(
                f"it implements transform(scores, allowed) but declares on = {on!r}; "
                'core.explicit applies a transform only with on = "logits" (before the '
                'softmax) or on = "probs" (after it)'
            )
        return out

    def transform(self, scores: Tensor, allowed: Tensor) -> Tensor:
        """Rewrite the logits or the probabilities (``on``) of ``core.explicit``."""
        raise NotImplementedError

    def score_mods(self) -> tuple[Any, ...]:
        """The engine score mods this part declares (applied after the position part's)."""
        return ()

    def normaliser(self) -> Any | None:
        """The engine normaliser this part declares (None: ``model.attention.normaliser``)."""
        return None

    @classmethod
    def declares(cls) -> bool:
        """The part is declared (``score_mods`` / ``normaliser``, no ``forward`` of its own):
        the layer runs it through the attention engine."""
        own = [_implements(cls, m, ScorePart) for m in ("score_mods", "normaliser")]
        return any(own) and not _implements(cls, "forward", ScorePart)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, core, ctx: ScoreContext):
        raise NotImplementedError("a declared score part runs through the attention engine")

    @classmethod
    def heads_out(cls, opts, dims) -> int:
        return dims.n_heads

    def attention_rows(self, q: Tensor, k: Tensor, v: Tensor, core, ctx: ScoreContext) -> Tensor:
        """The maps this part makes [B, H', R, Tk] for R query rows (``attnlab inspect`` asks
        for a block of rows at a time, so a long prompt never needs the [B, H', T, T] map):
        ``q`` holds the rows, ``ctx.allowed`` is their [R, Tk] mask (explicit, never
        ``is_causal``) and ``ctx.need_weights`` is True. Default: this part's own forward on the
        rows, which is exact for a part whose row i reads only row i's scores (the causal 1-D
        convolution). A part whose rows read other rows (a 2-D convolution) is exact for whole
        prompts only, and may override this."""
        _, probs = self(q, k, v, core, ctx)
        return probs


@dataclass
class ScoreContext:
    """The mask and bias of one attention call: ``allowed`` [Tq,Tk] bool or None with
    ``is_causal``; ``bias`` [H,Tq,Tk] or None; ``need_weights``: return the probabilities;
    ``padding`` [B,Tk] bool or None: True at real tokens of a right-padded batch (an encoder's
    variable-length rows; padded keys are masked out, and a score part must treat padded queries
    and keys as if the row ended there).

    The attention engine's form of the same call (what the layer passes the core when no score
    part forms the matrix): ``mask`` (the mask part's engine ``Mask``; ``allowed``, when also
    given, is its dense form for these rows), ``mods`` (score mods, in order), ``normaliser``
    (None: the core's), ``q_offset`` (the absolute position of query row 0) and ``q_pos``
    ([Tq] absolute positions of the rows when they are not consecutive, e.g. ``inspect``'s
    row blocks)."""

    allowed: Tensor | None
    is_causal: bool
    bias: Tensor | None = None
    need_weights: bool = False
    padding: Tensor | None = None
    mask: Any = None
    mods: tuple[Any, ...] = ()
    normaliser: Any = None
    q_offset: int = 0
    q_pos: Tensor | None = None


class FeatureMapPart(Part):
    """``feature_map``: x~ = F(x^), ``forward(x_hat [B,T,d]) -> [B,T,d]``, where x^ is the
    first norm's output (pre-LN; the block input itself with post-LN). x~ is what the query,
    key, value, readout and side-branch parts read. In the probe (``dims.pretrained``) it
    replaces the attention module's input of a pretrained model."""


class SideBranchPart(Part):
    """``side_branch``: ``forward(x_tilde [B,T,d]) -> [B,T,d]``, a term added to the block beside
    attention: h = x + attention + S(x~) (parallel residual: x + attention + FFN + S(x~)).
    In the probe it is added to the output of a pretrained model's attention module."""


class ReadoutPart(Part):
    """``readout``: ``forward(u [B,T,d], heads [B,H',T,d_h]) -> o [B,T,n_in]``, u = x~ and heads
    the score slot's output. ``width(opts, dims) -> n_in`` (a classmethod, default H' * d_h, the
    concatenated heads) is read before the mixer is built, which gets it as ``dims.mixer_in``;
    the part itself is built with ``dims.heads_out`` = H'. Cross-attention always uses the plain
    ``heads`` readout."""

    @classmethod
    def width(cls, opts, dims) -> int:
        return dims.heads_out * dims.head_dim


class MixerPart(Part):
    """``mixer``: ``forward(o [B,T,n_in]) -> [B,T,d]`` (W_O in the baseline), built with
    ``dims.mixer_in`` = n_in; its output is the attention branch's, added to the residual
    stream (the baseline initialises W_O with ``Init.out_std``)."""


class FFNPart(Part):
    """``ffn``: the position-wise feed-forward network, ``forward(x [B,T,d]) -> [B,T,d]``, x =
    the second norm of h (pre-LN; of the block input with a parallel residual; h itself with
    post-LN); not built when ``model.mlp = false``. Its hidden width comes from its options."""


class NormOptions(PartOptions):
    """What every norm is built from: ``bias`` (a norm that has one), ``eps``."""

    bias: bool = True
    eps: float = Field(1e-5, gt=0)


class NormPart(Part):
    """``norm``: the normalisation every norm of the stack uses (the block's norms and the final
    one), ``forward(x [B, T, d]) -> [B, T, d]`` over ``dims.d_model``. ``reset_norm()`` sets it
    to its identity settings (the default init calls it). Its options derive from
    :class:`NormOptions` (``bias``, ``eps``: parts with their own norms read them as
    ``dims.norm_bias``, ``dims.norm_eps``)."""

    Options = NormOptions
    param_label = "norm"

    @classmethod
    def declaration_problems(cls) -> list[str]:
        out = super().declaration_problems()
        if not (_implements(cls, "reset_norm", NormPart) or _implements(cls, "init_weights", Part)):
            out.append(
                "it implements neither reset_norm() nor init_weights(init), and the model's init "
                "calls reset_norm() on every norm"
            )
        return out

    def reset_norm(self) -> None:
        raise NotImplementedError

    def tp_plan(self) -> TPPlan:
        return TPPlan.whole("O(d) gains over the whole d-wide stream: whole on every rank")


class CrossAttentionPart(Part):
    """``cross_attention``: how the chosen decoder layers of ``model.family = "retrieval"``
    read the encoded neighbours (RETRO's chunked cross-attention; empty in other families).
    Built once per CCA layer with ``dims.model`` the whole config (``dims.model.retrieval``:
    chunk size m, k neighbours of r tokens), it is added to the residual stream after its block:
    ``forward(h [B, T, d], memory [B, C, k r, d]) -> [B, T, d]``, ``memory`` the neighbour
    encoder's output for the C chunks of m tokens (C = T // m; chunk j's neighbours were
    retrieved with the tokens of chunk j). Causality is the part's job: output p may read chunk
    j's neighbours only once p has seen all of chunk j (p >= (j + 1) m - 1); ``attnlab check``
    derives each chunk's neighbours from its tokens, so a part that reads them earlier fails
    its causality check. A part that declares ``supports_kv_cache = True`` also takes
    ``forward(h, memory, start=s, state=dict)`` in cached decoding: h holds positions s..s+T-1,
    memory the neighbours of every chunk they may read, ``state`` the layer's own dict in the
    K/V cache (kept across steps: the built-in part keeps each chunk's keys and values); the
    battery's kv_cache check proves it equals the full forward. Declared FLOPs per decoder token include the K/V work on the k r
    neighbour tokens of each chunk (k r / m neighbour tokens per decoder token)."""

    supports_kv_cache: ClassVar[bool] = False


@dataclass(frozen=True)
class Slot:
    """A named place in the block: the facts the rest of attnlab reads about it.

    - ``name``: the slot's name, also the key of its table in a model config (``config_field``);
    - ``base``: the contract class every part of the slot derives from;
    - ``default``: the kind a config gets when its table names none;
    - ``optional``: whether the slot may be empty (``kind = "none"``);
    - ``doc``: one line for ``attnlab parts``;
    - ``probe``: whether ``attnlab probe`` can inject the slot's parts into a pretrained model,
      as the place of such a part in a probe method's name (``preproj+skip+anchored-query``:
      feature_map 0, side_branch 1, query 2); None: it cannot. A part of a probed slot also
      declares ``probe_ready()`` (a query part: only with ``pretrained_delta``).
    """

    name: str
    base: type[Part]
    default: str
    optional: bool
    doc: str
    probe: int | None = None

    @property
    def config_field(self) -> str:
        """The config table that chooses and configures this slot's part (``model.<name>``)."""
        return f"model.{self.name}"

    def can_probe(self, cls: type[Part]) -> bool:
        """Whether ``attnlab probe`` can inject ``cls``, a part of this slot."""
        return self.probe is not None and cls.probe_ready()


SLOTS: dict[str, Slot] = {
    s.name: s
    for s in (
        Slot("feature_map", FeatureMapPart, "none", True, "pre-attention feature map of x^", 0),
        Slot("query", QueryPart, "linear", False, "query projection", 2),
        Slot("key", KeyPart, "linear", False, "key projection"),
        Slot("value", ValuePart, "linear", False, "value projection"),
        Slot("score", ScorePart, "none", True, "how scores become head outputs"),
        Slot("readout", ReadoutPart, "heads", False, "head readout before mixing"),
        Slot("mixer", MixerPart, "linear", False, "head mixing W_O"),
        Slot("side_branch", SideBranchPart, "none", True, "a branch beside attention", 1),
        Slot("ffn", FFNPart, "gelu", False, "position-wise feed-forward"),
        Slot("position", PositionPart, "learned", True, "how token positions enter the model"),
        Slot("mask", MaskPart, "causal", False, "which keys each query may see"),
        Slot("norm", NormPart, "layernorm", False, "the normalisation of every norm"),
        Slot(
            "cross_attention",
            CrossAttentionPart,
            NONE_KIND,
            True,
            "retrieval: how decoder layers read the encoded neighbours",
        ),
    )
}
NONE = NONE_KIND


def probe_slots() -> list[Slot]:
    """The slots whose parts ``attnlab probe`` can inject, in method-name (and hook) order."""
    probed = [s for s in SLOTS.values() if s.probe is not None]
    return sorted(probed, key=lambda s: s.probe)
