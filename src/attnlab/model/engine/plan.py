"""Which path one call takes, and the one line that says why.

In order of preference:

a. ``sdpa``: the mask is SDPA's own (no mask, or ``is_causal``), every mod folds (gains, exact
   columns) and the normaliser is softmax: one fused kernel call, bit-identical to plain SDPA
   when nothing is declared;
b. ``block_sparse``: every mod folds or is additive and the normaliser has an SDPA form, but the
   mask is not SDPA's own (a window, globals, documents, padding, an offset): one SDPA call per
   stack of gathered key blocks (``layout``, ``grouped``); on CPU, and wherever flex cannot run;
c. ``flex``: FlexAttention, on CUDA for any mask, mod or normaliser with a flex form, and on CPU
   for inference when ``flex_cpu_inference`` is on (it compiles for minutes first);
d. ``explicit``: the materialised scores, per stack of gathered blocks, for ``need_weights``,
   and for a general mod or a normaliser with no fused form where flex cannot run (CPU
   training: flex has no CPU backward).

The choice is logged once per configuration (logger ``attnlab.attention``, level INFO) and kept
as the engine's ``last_plan``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from attnlab.base.errors import UserError
from attnlab.model.engine.contracts import Normaliser
from attnlab.model.engine.folds import Folded

log = logging.getLogger("attnlab.attention")
PATHS = ("sdpa", "block_sparse", "flex", "explicit")
_announced: set[str] = set()


@dataclass(frozen=True)
class Plan:
    """A path and the reason it was chosen."""

    path: str
    reason: str


@dataclass(frozen=True)
class Situation:
    """What the choice reads about one call."""

    device: str
    grad: bool
    need_weights: bool
    dense: str | None  # "full" | "causal" | None: the mask is SDPA's own at this shape
    dropout: float
    flex_cpu_inference: bool


def flex_refusal(s: Situation) -> str | None:
    """Why flex cannot run this call (None: it can)."""
    if s.dropout:
        return "flex has no attention dropout"
    if s.device == "cuda":
        return None
    if s.device == "cpu" and s.grad:
        return "flex has no backward on CPU"
    if s.device == "cpu" and not s.flex_cpu_inference:
        return "flex on CPU inference is off (flex_cpu_inference; it compiles for minutes)"
    return None if s.device == "cpu" else f"flex does not run on {s.device}"


def choose(folded: Folded, normaliser: Normaliser, s: Situation, forced: str = "auto") -> Plan:
    """The path for one call (``forced``: the one asked for, refused if it cannot run)."""
    what = _unfused(folded, normaliser)
    flex_no = flex_refusal(s) or (
        None if normaliser.flex() is not None else f"{normaliser.name} has no flex form"
    )
    sdpa_mask = s.dense is not None and not folded.biases and normaliser.sdpa == "softmax"
    if forced != "auto":
        return _forced(forced, what, flex_no, sdpa_mask, s)
    if s.need_weights:
        return Plan("explicit", "need_weights: the attention maps are returned")
    if what:
        if flex_no is None:
            return Plan("flex", f"{what} has no SDPA form; flex runs it fused")
        return Plan("explicit", f"{what} has no SDPA form and {flex_no}")
    if sdpa_mask:
        mods = "mods folded into q/k" if not folded.trivial else "nothing declared"
        return Plan("sdpa", f"mask is {s.dense}, {mods}")
    if s.device == "cuda" and flex_no is None:
        return Plan("flex", "a mask or bias SDPA cannot skip; flex's block mask does")
    return Plan("block_sparse", _sparse_reason(folded, normaliser, s))


def _unfused(folded: Folded, normaliser: Normaliser) -> str:
    """The declared ideas SDPA cannot run ('' when it can run them all)."""
    names = [type(m).__name__ for m in folded.general]
    if normaliser.sdpa is None:
        names.append(f"normaliser {normaliser.name}")
    return " and ".join(names)


def _sparse_reason(folded: Folded, normaliser: Normaliser, s: Situation) -> str:
    why = "the mask is not SDPA's own at this shape" if s.dense is None else "a float bias"
    if normaliser.sdpa == "sink" and s.dense is not None:
        why = "softmax-plus-one adds a sink key is_causal cannot place"
    where = "flex has no backward on CPU" if s.device == "cpu" and s.grad else "no flex here"
    return f"{why}; SDPA per stack of gathered key blocks ({where})"


def _forced(forced: str, what: str, flex_no: str | None, sdpa_mask: bool, s: Situation) -> Plan:
    """A path asked for by name, or a UserError saying why it cannot run this call."""
    if forced not in PATHS:
        raise UserError(f"attention path {forced!r} is not one of {', '.join(PATHS)}, auto")
    problem = None
    if forced == "sdpa" and (what or not sdpa_mask):
        problem = what or "the mask, a float bias or the normaliser needs more than is_causal"
    elif forced == "block_sparse" and what:
        problem = what + " has no SDPA form"
    elif forced == "flex":
        problem = flex_no
    if problem:
        raise UserError(
            f"attention path {forced!r} cannot run this call: {problem}; use path 'auto'"
        )
    return Plan(forced, "asked for")


def announce(plan: Plan, spec_line: str) -> None:
    """Log the path once per (path, reason, configuration)."""
    line = f"attention path {plan.path}: {plan.reason} [{spec_line}]"
    if line not in _announced:
        _announced.add(line)
        log.info(line)
