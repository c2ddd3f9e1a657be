"""KV cache: prefilling a few tokens and then decoding token by token with the cache gives the
logits of one full forward (to 1e-9 in float64), in every causal config a part is accepted in.
A part that declares ``supports_kv_cache = False`` is decoded without a cache by ``generate``
and is not checked."""

from __future__ import annotations

import torch

from attnlab.parts import families
from attnlab.testing.cases import Case, T, forward, ids
from attnlab.testing.finite import difference, nonfinite
from attnlab.testing.result import Result, failed, passed, skipped

NAME = "kv_cache"
LIMIT = 1e-9
PREFILL = 3


@torch.no_grad()
def measure(model, case: Case, name: str = "the part") -> float | Result:
    """max |token-by-token logits - full-forward logits| (infinite where either is NaN); a
    failure when the full forward is not finite."""
    x = ids(2, seed=3)
    full = forward(model, case, x)
    bad = nonfinite(NAME, name, full, case.name)
    if bad is not None:
        return bad
    cache = model.new_cache(2, T)
    first = max(PREFILL, case.prefix)  # a prefix LM's prefix reads itself both ways: prefill it
    steps = [forward(model, case, x[:, :first], enc=x, cache=cache)]
    for t in range(first, T):
        steps.append(forward(model, case, x[:, t : t + 1], enc=x, cache=cache))
    return difference(torch.cat(steps, 1), full)


def check(name: str, cls: type, built: list[tuple[Case, torch.nn.Module]]) -> Result:
    if not cls.supports_kv_cache:
        return skipped(
            NAME,
            f"{name} declares supports_kv_cache = False: generate() and the export decode by "
            "full forwards",
        )
    # the families that decode with a cache (not the retrieval decoder: its neighbours grow
    # with every chunk)
    causal = [(c, m) for c, m in built if c.causal and families.get(c.family).decodes_with_cache]
    if not causal:
        return skipped(
            NAME, "no config that decodes with a cache accepts the part (encoders, retrieval)"
        )
    worst = 0.0
    for case, model in causal:
        d = measure(model, case, name)
        if isinstance(d, Result):
            return d
        if not d <= LIMIT:
            return failed(
                NAME,
                f"token-by-token decoding differs from the full forward by {d:.3g} (limit "
                f"{LIMIT:g}) while {name} declares supports_kv_cache = True",
                "a part that mixes over time must declare supports_kv_cache = False, or keep "
                "what the cache needs (the cache holds only each layer's keys and values; a "
                "decoding step sees one new token)",
                d,
                LIMIT,
                case.name,
            )
        worst = max(worst, d)
    return passed(
        NAME,
        f"token-by-token decoding equals the full forward (max |difference| {worst:.3g}) in "
        f"{len(causal)} causal configs",
        worst,
        LIMIT,
    )
