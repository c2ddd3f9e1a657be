"""The ``position`` slot's contract: how a position part says where it enters the model.

Kept beside :mod:`attnlab.parts.slots` (which lists the slot) because its declarations are the
longest of any slot's: a position part enters as absolute embeddings, a logit bias, a rotation, a
key fold, or engine score mods, and the registry refuses one whose declarations leave it unused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from torch import Tensor, nn

from attnlab.base.schema import PartOptions
from attnlab.parts.part import Part, _implements
from attnlab.parts.tp import TPPlan


class PositionPart(Part):
    """``position``: how token positions enter the model. Built once per stack (an
    encoder-decoder's encoder and decoder each get their own; ``dims.causal`` says which) for
    what acts inside attention, and once for the embeddings when it adds a vector to them. The
    model never calls its ``forward(...)``: a part declares which of three ways in it uses, and
    implements those methods:

    - ``absolute`` (learned, sinusoidal): ``embed(positions [T]) -> [T, d]``, added to the token
      embeddings (the module is the model's ``abs_pos``);
    - ``logit_bias`` (ALiBi, T5, KERPLE-like plugins): ``bias(q_pos [Tq], k_pos [Tk]) -> [H,
      Tq, Tk]``, added to the attention logits (the dense form: the explicit path and score
      parts that form the matrix read it), and optionally ``score_mods(causal)``: the same
      bias as attention-engine score mods, which run fused without the [H, Tq, Tk] table. The
      flash kernel takes no bias, so the config refuses ``model.attention.backend = "flash"``
      with such a part;
    - ``rotary`` (RoPE): ``rotation(positions [T], dtype) -> tables`` once per forward, then
      ``rotate(x [B, h, T, d_h], tables) -> x'`` on q and on the new keys, before the keys enter
      the KV cache (the cache stores rotated keys; a rotation must depend on the absolute
      position only, so that cached keys stay valid).

    Other declarations read: ``length_limit(opts, model) -> int | None`` (a classmethod: the
    longest sequence it can place, e.g. a learned table's ``model.max_seq_len``; None: no
    limit, so evaluation and generation may run past the training length) with
    ``limit_reason`` (the sentence a refusal quotes) and ``limit_noun`` (what it counts); ``key_fold`` (a function ``(q, k, scale,
    offset) -> (q', k')`` whose scaled dot products carry this part's bias in a causal stack,
    with ``key_fold_width`` extra columns: how ``score.virtual_heads_fused`` convolves a bias
    with the keys; None: the bias cannot be folded). A part adds nothing to the KV cache beyond
    the keys it rotates; its parameters and ``extra_flops`` are declared like any part's.
    """

    def score_mods(self, causal: bool) -> tuple[Any, ...] | None:
        """A ``logit_bias`` part's bias as attention-engine score mods (``causal``: the mask
        allows only keys at or before their query), so it runs fused (ALiBi's exact columns,
        T5's bias over the gathered pairs only); None (the default): the engine adds
        ``bias(q_pos, k_pos)`` as a dense [H, Tq, Tk] table, as before."""
        return None

    absolute: ClassVar[bool] = False
    logit_bias: ClassVar[bool] = False
    rotary: ClassVar[bool] = False
    limit_reason: ClassVar[str] = ""
    #: what the limit counts, for messages ("the model's 128 learned positions")
    limit_noun: ClassVar[str] = "positions"
    key_fold: ClassVar[Callable[..., tuple[Tensor, Tensor]] | None] = None
    key_fold_width: ClassVar[int] = 0

    #: each way in, with the methods a part declaring it implements
    WAYS: ClassVar[dict[str, tuple[str, ...]]] = {
        "absolute": ("embed",),
        "logit_bias": ("bias",),
        "rotary": ("rotation", "rotate"),
    }

    @classmethod
    def declaration_problems(cls) -> list[str]:
        """A position part is used only through the ways it declares: each needs its methods,
        each implemented method its declaration, and at least one way (else it is dropped)."""
        out = []
        declared = [w for w in cls.WAYS if getattr(cls, w) is True]
        for way, methods in cls.WAYS.items():
            own = [m for m in methods if _implements(cls, m, PositionPart)]
            if way in declared and len(own) < len(methods):
                missing = [f"{m}()" for m in methods if m not in own]
                out.append(f"it declares {way} = True but implements no {' or '.join(missing)}")
            elif way not in declared and own:
                out.append(
                    f"it implements {', '.join(f'{m}()' for m in own)} but does not declare "
                    f"{way} = True, so the model never calls it"
                )
        if not declared and not out:
            out.append(
                "it declares none of absolute = True (embed(positions) added to the token "
                "embeddings), logit_bias = True (bias(q_pos, k_pos) added to the logits) or "
                "rotary = True (rotation() and rotate() on q and k), so the model never uses it"
                + (
                    " (the model never calls a position part's forward)"
                    if _implements(cls, "forward", nn.Module)
                    else ""
                )
            )
        if cls.key_fold is not None and "logit_bias" not in declared:
            out.append("it sets key_fold, which is read only with logit_bias = True")
        return out

    @classmethod
    def length_limit(cls, opts: PartOptions, model: Any) -> int | None:
        return None

    def embed(self, positions: Tensor) -> Tensor:
        raise NotImplementedError

    def bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        raise NotImplementedError

    def rotation(self, positions: Tensor, dtype: Any) -> Any:
        raise NotImplementedError

    def rotate(self, x: Tensor, tables: Any) -> Tensor:
        raise NotImplementedError

    def tp_plan(self) -> TPPlan:
        return TPPlan.whole(
            "positions are computed whole; a logit bias [H, Tq, Tk] is sliced to the rank's heads"
        )
