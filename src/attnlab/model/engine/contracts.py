"""What a mask, a score modification and a normaliser declare to the attention engine.

The conventions are FlexAttention's (``torch.nn.attention.flex_attention``), so a mod written for
attention-gym runs here unchanged:

- positions are absolute: query row i of a call sits at ``q_idx = q_offset + i`` (``q_offset``
  is the cached prefix while decoding, 0 otherwise), key column j at ``kv_idx = j``;
- ``mask_mod(b, h, q_idx, kv_idx) -> bool``: True where query ``q_idx`` of batch row ``b`` and
  head ``h`` may attend to key ``kv_idx``;
- ``score_mod(score, b, h, q_idx, kv_idx) -> score``: rewrites one logit, ``score = scale *
  q . k`` (the scale folded in, as flex does); mods compose in order, each seeing the last's
  output.

Both are elementwise: flex calls them on scalars under ``vmap``, the engine on broadcast index
tensors (``b`` [B,1,1,1,1], ``h`` [1,1,H,1,1], ``q_idx`` [1,n,1,Q,1], ``kv_idx`` [1,n,1,1,K]).
Tensor ops, indexing a table with them (``table[h]``, ``doc[b, q_idx]``) and ``torch.where`` work
both ways; a Python ``if`` on a value works in neither.

Everything beyond the function is an optional declaration that lets the engine skip work or run a
fused kernel; it never changes the result. Every path equals the plain definition (the mods
applied in order, then the mask, then the normaliser) to float64 rounding, and
``tests/test_attention_engine.py`` proves it for every built-in, so a declaration that lies is
caught there, not trusted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
ScoreModFn = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


class Mask:
    """Which keys each query may see: ``mask_mod`` plus optional structure hints.

    Hints (each optional; a hint may over-cover, never under-cover, since the exact
    ``mask_mod`` is evaluated on every pair the engine gathers). ``causal``, ``window`` and
    ``block_map`` describe the pairs apart from those ``global_keys`` and ``global_queries``
    cover:

    - ``causal``: allows only ``kv_idx <= q_idx``;
    - ``window``: allows only ``q_idx - kv_idx < window`` (causal) or ``|q_idx - kv_idx| <
      window``;
    - ``block_map(q_lo, q_hi, kv_lo, kv_hi) -> [nQ, nK] bool``: whether any pair of query block
      [q_lo, q_hi] and key block [kv_lo, kv_hi] may be allowed (inclusive absolute positions),
      without evaluating the pairs. Default: from ``causal`` and ``window``, else None (the
      engine then evaluates ``mask_mod`` block row by block row: O(T^2) evaluations, O(T B)
      memory);
    - ``global_keys(kv_len) -> [G] long`` keys that any query may see, gathered one by one
      instead of by block (local+global's every k-th token), and ``global_queries(q_offset,
      q_len) -> [R] long`` query positions that may see any key (computed over all keys);
    - ``block_size``: the layout block that fits the pattern (BigBird's random blocks);
    - ``dense(q_len, kv_len, q_offset) -> "full" | "causal" | None``: the mask is all of the
      pairs (no mask) or exactly SDPA's ``is_causal`` at this shape, so the plain kernel runs;
    - ``uses_batch``: ``mask_mod`` reads ``b`` (per-row document ids, padding).

    ``fit(q_end, kv_len, device) -> Mask`` returns the mask ready for queries below ``q_end`` and
    ``kv_len`` keys (a mask with per-length tables, BigBird's random blocks, builds them here;
    default: itself). ``token()`` is a hashable that changes when the pattern does (layouts and
    flex block masks are cached by it).
    """

    name: ClassVar[str] = "mask"
    causal: bool = False
    window: int | None = None
    block_size: int | None = None
    uses_batch: bool = False

    def mask_mod(self, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        raise NotImplementedError

    def fit(self, q_end: int, kv_len: int, device) -> Mask:
        return self

    def token(self) -> object:
        """Plain options by value, tensors by identity and version (a changed table changes
        the token, so no cached layout or block mask outlives it)."""
        tensors = tuple(
            (k, id(v), version(v)) for k, v in sorted(vars(self).items()) if isinstance(v, Tensor)
        )
        return (type(self).__name__, tuple(sorted(_plain_attrs(self).items())), tensors)

    def dense(self, q_len: int, kv_len: int, q_offset: int) -> str | None:
        return None

    def block_map(self, q_lo: Tensor, q_hi: Tensor, kv_lo: Tensor, kv_hi: Tensor) -> Tensor | None:
        if not self.causal and self.window is None:
            return None
        i_lo, i_hi = q_lo[:, None], q_hi[:, None]
        j_lo, j_hi = kv_lo[None, :], kv_hi[None, :]
        out = torch.ones(len(q_lo), len(kv_lo), dtype=torch.bool, device=q_lo.device)
        if self.causal:
            out = out & (j_lo <= i_hi)
        if self.window is not None:
            out = out & (j_hi > i_lo - self.window)
            if not self.causal:
                out = out & (j_lo < i_hi + self.window)
        return out

    def global_keys(self, kv_len: int, device) -> Tensor | None:
        return None

    def global_queries(self, q_offset: int, q_len: int, device) -> Tensor | None:
        return None

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in _plain_attrs(self).items())
        return f"{type(self).__name__}({args})"


@dataclass
class Term:
    """One exact low-rank piece of an additive bias: ``bias[h, i, j] = q_cols[h, i] . k_cols[j]``.

    ``q_cols`` [n, H, Q, r] (or broadcastable: [n, 1, Q, r], [n, H, 1, r]), ``k_cols`` [n, K, r],
    both over the gathered positions of n groups; the engine appends them to q and k (q's side
    divided by the softmax scale) so SDPA's own dot product adds the bias. ``row_constant``:
    ``k_cols`` is all ones, the term moves every logit of a row equally, and a shift-invariant
    normaliser (softmax) lets the engine drop it. ``magnitude``: the largest column product
    that carries weight in the result (what float rounding of the fold is judged by; None: the
    largest product over every pair, the safe bound). A decaying bias knows better: ALiBi's far
    keys carry large products but weights below exp(-m |i - j|)."""

    q_cols: Tensor
    k_cols: Tensor
    row_constant: bool = False
    magnitude: float | None = None


class ScoreMod:
    """A logit rewrite: ``score_mod(score, b, h, q_idx, kv_idx) -> score``.

    ``kind`` declares what exact fold the engine may use instead of calling it per entry:

    - ``"general"`` (default): nothing; the engine runs flex (where it can) or the explicit
      path with the function itself;
    - ``"scale"``: ``score_mod(s) == s * head_scale()[h]``; ``head_scale() -> [H]`` (it may be a
      learned parameter) multiplies q per head, free in every kernel;
    - ``"bias"``: ``score_mod(s) == s + bias(b, h, q_idx, kv_idx)`` (``bias`` returning None,
      the default, means ``score_mod(0, ...)``); SDPA takes it as a float mask over the gathered pairs only, and
      ``separable(h, q_idx, kv_idx, centre) -> [Term] | None`` may write it exactly as a few
      extra q/k columns (``centre`` [n] a position per group the terms may subtract, to keep
      the column products small in floating point), and ``band() -> D`` may declare that the
      bias is one value per head beyond D keys (causal), so only a band of width D needs it.

    ``uses_batch``: the mod reads ``b``.
    """

    kind: ClassVar[str] = "general"
    uses_batch: ClassVar[bool] = False

    def score_mod(self, score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor):
        raise NotImplementedError

    def head_scale(self) -> Tensor:
        raise NotImplementedError

    def bias(self, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor | None:
        return None

    def separable(self, h: Tensor, q_idx: Tensor, kv_idx: Tensor, centre: Tensor):
        return None

    def band(self) -> int | None:
        """``kind = "bias"`` only: D such that, on causal pairs, ``bias(b, h, i, j)`` depends
        on h and j - i alone and equals ``bias(b, h, D, 0)`` (one value per head) whenever
        ``i - j >= D`` (T5's last bucket); None: no such D. The engine then runs the far keys
        on plain causal SDPA and the bias over the band only (``band.py``)."""
        return None


@dataclass(frozen=True)
class FlexForm:
    """A normaliser as FlexAttention runs it: ``score_mod`` appended to the mods, then
    ``finish(out, lse) -> out`` (``lse`` [B, H, Q] the log-sum-exp flex returns)."""

    score_mod: ScoreModFn | None
    finish: Callable[[Tensor, Tensor], Tensor] | None


class Normaliser:
    """How a row of masked logits becomes attention weights.

    ``weights(scores [..., K], allowed [..., K]) -> [..., K]``: the explicit form (scores at
    masked entries are undefined; the engine zeroes the weights there). Declarations:
    ``sdpa`` = ``"softmax"`` (SDPA's own), ``"sink"`` (softmax with one more zero logit: a zero
    key and value appended) or None (no SDPA form); ``shift_invariant``: adding a constant to a
    row changes nothing (lets the engine drop row-constant bias terms); ``flex()`` -> a
    :class:`FlexForm` or None (no fused form: the explicit path runs)."""

    name: ClassVar[str] = "normaliser"
    sdpa: ClassVar[str | None] = None
    shift_invariant: ClassVar[bool] = False

    def weights(self, scores: Tensor, allowed: Tensor) -> Tensor:
        raise NotImplementedError

    def flex(self) -> FlexForm | None:
        return None

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in _plain_attrs(self).items())
        return f"{type(self).__name__}({args})"


def mod_parameters(mod: object) -> list[Tensor]:
    """The learned tensors a mod reads: an ``nn.Module``'s parameters, else the tensors among
    its attributes that require grad (a plugin's mod holding its part's ``nn.Parameter``)."""
    params = getattr(mod, "parameters", None)
    if callable(params):
        return [p for p in params() if p.requires_grad]
    return [t for t in vars(mod).values() if isinstance(t, Tensor) and t.requires_grad]


def version(t: Tensor) -> int:
    """``t``'s in-place version counter (an inference tensor has none and cannot change in
    place outside inference mode: -1)."""
    return -1 if t.is_inference() else t._version


def _plain_attrs(obj) -> dict:
    """The instance's plain option values (numbers, strings, tuples), for repr and cache keys."""
    return {
        k: v
        for k, v in vars(obj).items()
        if not k.startswith("_") and isinstance(v, (int, float, str, bool, tuple, type(None)))
    }
