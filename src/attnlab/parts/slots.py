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

Each contract lists what the assembly calls; a part implements ``forward`` and may implement the
optional methods it can support (a query part that only has ``forward`` works: it is simply not
fused with K and V).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from attnlab.parts.part import Part

FusedRows = list[tuple[Tensor, Tensor | None]]


class ProjectionPart(Part):
    """A projection of x~ that may join the fused Q/K/V matmul.

    ``forward(u [B,T,d]) -> [B,T,width_out]``. To be fused, a part returns its weight rows from
    ``fused_weights()`` ([(W [r, d], b [r] or None), ...], ``fused_width`` = the total r) and turns
    its slice of the fused product into its output in ``finish(u, part)``. The default says the
    part cannot be fused (it then runs its own ``forward``).
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
    """``query``: q = Q(x~) [B,T,H*d_h].

    ``scale_multiplier`` multiplies the softmax scale 1/sqrt(d_h) (a part may realise a constant
    factor on q there instead). On a pretrained model (``dims.pretrained``) the base keeps its W_Q
    and ``pretrained_delta(u, q_base)`` is what the part adds to the base's query q_base; a query
    part without it cannot be probed.
    """

    scale_multiplier: float = 1.0

    def pretrained_delta(self, u: Tensor, q_base: Tensor) -> Tensor:
        raise NotImplementedError

    @classmethod
    def probe_ready(cls) -> bool:
        return cls.pretrained_delta is not QueryPart.pretrained_delta


class KeyPart(ProjectionPart):
    """``key``: k = K(x~) [B,T,H_kv*d_h]."""


class ValuePart(ProjectionPart):
    """``value``: v = V(x~) [B,T,H_kv*d_h]."""


class ScorePart(Part):
    """``score``: how per-head scores become head outputs.

    ``forward(q [B,H,Tq,d_h], k, v [B,H_kv,Tk,d_h], core, ctx) -> (heads [B,H',Tq,d_h], probs or
    None)``. ``core`` is the :class:`~attnlab.model.attention.AttentionCore` (its ``sdpa`` and
    ``explicit`` paths); ``ctx`` the :class:`ScoreContext`. ``heads_out(dims)`` is H'. A part that
    reads the T x T matrix declares ``needs_attention_matrix = True``.
    """

    @classmethod
    def heads_out(cls, opts, dims) -> int:
        return dims.n_heads


@dataclass
class ScoreContext:
    """The mask and bias of one attention call: ``allowed`` [Tq,Tk] bool or None with
    ``is_causal``; ``bias`` [H,Tq,Tk] or None; ``need_weights``: return the probabilities;
    ``padding`` [B,Tk] bool or None: True at real tokens of a right-padded batch (an encoder's
    variable-length rows; padded keys are masked out, and a score part must treat padded queries
    and keys as if the row ended there)."""

    allowed: Tensor | None
    is_causal: bool
    bias: Tensor | None = None
    need_weights: bool = False
    padding: Tensor | None = None


class FeatureMapPart(Part):
    """``feature_map``: x~ = F(x^) [B,T,d], read by Q, K, V and the side branch."""


class SideBranchPart(Part):
    """``side_branch``: a term S(x~) [B,T,d] added to the block output beside attention."""


class ReadoutPart(Part):
    """``readout``: heads [B,H',T,d_h] and x~ -> o [B,T,n_in]; ``width(opts, dims)`` is n_in."""

    @classmethod
    def width(cls, opts, dims) -> int:
        return dims.heads_out * dims.head_dim


class MixerPart(Part):
    """``mixer``: o [B,T,n_in] -> [B,T,d] (W_O in the baseline); built with ``dims.mixer_in``."""


class FFNPart(Part):
    """``ffn``: the position-wise feed-forward network, [B,T,d] -> [B,T,d]."""


@dataclass(frozen=True)
class Slot:
    """A named place in the block: its contract, default kind, and whether it may be empty."""

    name: str
    base: type[Part]
    default: str
    optional: bool
    doc: str
    probe: bool = False  # a part of this slot can be injected into a pretrained model


SLOTS: dict[str, Slot] = {
    s.name: s
    for s in (
        Slot("feature_map", FeatureMapPart, "none", True, "pre-attention feature map of x^", True),
        Slot("query", QueryPart, "linear", False, "query projection", True),
        Slot("key", KeyPart, "linear", False, "key projection"),
        Slot("value", ValuePart, "linear", False, "value projection"),
        Slot("score", ScorePart, "none", True, "how scores become head outputs"),
        Slot("readout", ReadoutPart, "heads", False, "head readout before mixing"),
        Slot("mixer", MixerPart, "linear", False, "head mixing W_O"),
        Slot("side_branch", SideBranchPart, "none", True, "a branch beside attention", True),
        Slot("ffn", FFNPart, "gelu", False, "position-wise feed-forward"),
    )
}
NONE = "none"
