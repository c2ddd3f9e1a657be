"""Effect: the part changes what the model computes. A part whose declarations leave it unused
(a position part that declares none of ``absolute``/``logit_bias``/``rotary``, a part the
assembly never builds or never calls) would list, count and train as if it were there while the
model runs without it; this property fails it.

In every config the part is accepted in, the model must hold the part, and one of these must move
the logits by more than :data:`LIMIT` (float64; a part that is used moves them by far more):

1. its parameters and floating buffers, each element moved by N(0, 0.5^2);
2. what its ``forward`` returns, moved the same way (a forward hook; the part's output must be
   read);
3. for an optional slot, the same model with the slot empty (``kind = "none"``, the other weights
   loaded from the model's state dict).

A part on which none of the three can be tried (no tensors, never called through ``forward``,
in a slot that cannot be empty) is skipped with that reason.
"""

from __future__ import annotations

import torch

from attnlab.config import ConfigError
from attnlab.parts import SLOTS
from attnlab.testing.cases import Case, build, config_for, forward, ids, instances
from attnlab.testing.finite import difference, nonfinite
from attnlab.testing.result import Result, failed, passed, skipped

NAME = "effect"
#: an unused part leaves the float64 logits exactly as they were
LIMIT = 1e-10
SCALE = 0.5


def _noise(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    return (torch.randn(t.shape, generator=gen, dtype=torch.float64) * SCALE).to(t.dtype)


@torch.no_grad()
def _tensors_moved(model, case: Case, parts: list, x, base) -> float | None:
    """|logits change| when the parts' floating tensors move (None: they have none)."""
    tensors = list(
        {
            id(t): t
            for p in parts
            for t in (*p.parameters(), *p.buffers())
            if t.is_floating_point() and t.numel()
        }.values()
    )
    if not tensors:
        return None
    saved = [t.detach().clone() for t in tensors]
    gen = torch.Generator().manual_seed(13)
    try:
        for t in tensors:
            t.add_(_noise(t, gen))
        return difference(forward(model, case, x), base)
    finally:
        for t, s in zip(tensors, saved):
            t.copy_(s)


@torch.no_grad()
def _output_moved(model, case: Case, parts: list, x, base) -> float | None:
    """|logits change| when what the parts' forwards return moves (None: never called)."""
    gen = torch.Generator().manual_seed(14)
    calls = [0]

    def hook(_m, _args, out):
        calls[0] += 1
        if isinstance(out, torch.Tensor) and out.is_floating_point():
            return out + _noise(out, gen)
        if isinstance(out, tuple) and out and isinstance(out[0], torch.Tensor):
            return (out[0] + _noise(out[0], gen), *out[1:])
        return None

    handles = [p.register_forward_hook(hook) for p in parts]
    try:
        out = forward(model, case, x)
    finally:
        for h in handles:
            h.remove()
    return difference(out, base) if calls[0] else None


@torch.no_grad()
def _removed(model, case: Case, slot: str, x, base) -> float | None:
    """|logits change| against the same model with the slot empty (None: the slot cannot be
    empty here, or the models' other weights do not match)."""
    if not SLOTS[slot].optional:
        return None
    try:
        cfg = config_for(case, slot, "none", {})
    except ConfigError:
        return None
    bare = build(cfg, seed=0, spread=0.0)
    missing, _ = bare.load_state_dict(model.state_dict(), strict=False)
    if missing:
        return None
    return difference(forward(bare, case, x), base)


def _unused(name: str, case: Case, why: str, measured: float = 0.0) -> Result:
    return failed(
        NAME,
        f"{name} has no effect on the model's output: {why}",
        "declare how the part enters the model (a position part: absolute = True with embed(), "
        "logit_bias = True with bias(), or rotary = True with rotation() and rotate()), and "
        "return what forward computes",
        measured,
        LIMIT,
        case.name,
    )


def measure(name: str, cls: type, slot: str, case: Case, model) -> Result | float | None:
    """The largest logit change one of the three ways found in ``case`` (None: no way applies);
    a failure when the model does not hold the part or its output is not finite."""
    parts = instances(model, cls)
    if not parts:
        return _unused(name, case, f"the model of this config holds no {cls.__name__} module")
    x = ids(2, seed=12)
    base = forward(model, case, x)
    bad = nonfinite(NAME, name, base, case.name)
    if bad is not None:
        return bad
    tried = None
    for way in (_tensors_moved, _output_moved):
        d = way(model, case, parts, x, base)
        if d is not None and not d <= LIMIT:
            return d
        tried = d if d is not None else tried
    d = _removed(model, case, slot, x, base)
    return d if d is not None else tried


def check(name: str, cls: type, slot: str, built: list[tuple[Case, torch.nn.Module]]) -> Result:
    least, n = None, 0
    for case, model in built:
        got = measure(name, cls, slot, case, model)
        if isinstance(got, Result):
            return got
        if got is None:
            continue
        if got <= LIMIT:
            return _unused(
                name,
                case,
                f"moving its parameters, buffers and outputs (N(0, {SCALE}) each)"
                + (" or emptying its slot" if SLOTS[slot].optional else "")
                + f" changes the logits by {got:.3g} (limit {LIMIT:g})",
                got,
            )
        least, n = got if least is None else min(least, got), n + 1
    if not n:
        return skipped(
            NAME,
            f"{name} has no parameters or buffers, is not called through forward, and its slot "
            "cannot be empty: nothing to move",
        )
    return passed(
        NAME,
        f"the part moves the logits in {n} configs (the least by {least:.3g} when its tensors, "
        "outputs or slot change)",
        least,
        LIMIT,
    )
