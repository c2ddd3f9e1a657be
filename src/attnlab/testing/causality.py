"""Causality: changing the tokens at and after position t leaves every output before t unchanged
(decoders, prefix LMs after their prefix, an encoder-decoder's decoder). Bidirectional encoders
read both ways by design and are not checked. An output that is NaN or infinite fails on its own
(a NaN compares as a change, so it can never hide a read of the future)."""

from __future__ import annotations

import torch

from attnlab.testing.cases import VOCAB, Case, T, forward, ids
from attnlab.testing.finite import difference, nonfinite
from attnlab.testing.result import Result, failed, passed, skipped

NAME = "causality"
#: float64 outputs of unchanged inputs agree to rounding; a leak moves them by far more
LIMIT = 1e-10


@torch.no_grad()
def prefix_of(model, case: Case) -> int:
    """The positions that read each other both ways: the case's prefix, or the prefix of the
    model's own mask part (a prefix mask under test brings its ``prefix_len``)."""
    mask = getattr(getattr(model, "cfg", None), "mask", None)
    return max(case.prefix, int(getattr(mask, "prefix_len", 0) or 0))


def measure(model, case: Case, name: str = "the part") -> tuple[float, int] | Result:
    """(max |change| of the outputs before t, the t where it was largest); a failure when an
    output is not finite (NaN counts as a change, never as agreement)."""
    x = ids(2, seed=1)
    base = forward(model, case, x)
    bad = nonfinite(NAME, name, base, case.name)
    if bad is not None:
        return bad
    start = max(prefix_of(model, case), 1)
    worst, at = 0.0, start
    for t in sorted({start, (start + T) // 2, T - 1}):
        y = x.clone()
        y[:, t:] = (x[:, t:] + 1 + ids(2, seed=2)[:, t:] % (VOCAB - 1)) % VOCAB  # every one differs
        out = forward(model, case, y, enc=x)
        d = difference(out[:, :t], base[:, :t])
        if not d <= worst:
            worst, at = d, t
    return worst, at


def check(name: str, built: list[tuple[Case, torch.nn.Module]]) -> Result:
    causal = [(c, m) for c, m in built if c.causal]
    if not causal:
        return skipped(NAME, "no causal config accepts the part (bidirectional encoders only)")
    worst = 0.0
    for case, model in causal:
        got = measure(model, case, name)
        if isinstance(got, Result):
            return got
        d, t = got
        if not d <= LIMIT:
            P = prefix_of(model, case)
            after = f" (after the prefix of {P})" if P else ""
            return failed(
                NAME,
                f"changing the tokens at and after position {t}{after} changed the outputs "
                f"before it by {d:.3g} (limit {LIMIT:g}): {name} lets a position read later ones",
                "a causal stack must read only positions <= t: a score part masks its scores "
                "with ctx.allowed / ctx.is_causal, and a part that mixes over time reads only "
                "earlier tokens (a running sum, not a mean over the whole sequence)",
                d,
                LIMIT,
                case.name,
            )
        worst = max(worst, d)
    return passed(
        NAME,
        f"outputs before t unchanged by tokens at and after t (max |change| {worst:.3g}) "
        f"in {len(causal)} causal configs",
        worst,
        LIMIT,
    )
