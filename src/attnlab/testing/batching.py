"""Batch and padding invariance: a row's outputs do not depend on the other rows of its batch,
nor on tokens past its end (an encoder's right-padded rows with a padding mask; a causal row cut
short)."""

from __future__ import annotations

import torch

from attnlab.parts import families
from attnlab.testing.cases import Case, T, forward, ids
from attnlab.testing.finite import difference, nonfinite
from attnlab.testing.result import Result, failed, passed

NAME = "batch"
LIMIT = 1e-10
LENGTHS = (T, 6, 8)


@torch.no_grad()
def measure(model, case: Case, name: str = "the part") -> tuple[float, float] | Result:
    """(max |row in a batch - row alone|, max |padded or longer row - the row cut to length|);
    a failure when an output is not finite (NaN counts as a difference)."""
    x = ids(len(LENGTHS), seed=4)
    together = forward(model, case, x)
    bad = nonfinite(NAME, name, together, case.name)
    if bad is not None:
        return bad
    rows = max(
        difference(forward(model, case, x[i : i + 1]), together[i : i + 1])
        for i in range(x.shape[0])
    )
    if families.get(case.family).takes_padding_mask:
        n = torch.tensor(LENGTHS)
        mask = torch.arange(T)[None, :] < n[:, None]
        padded = model(x, padding_mask=mask).logits
        pad = max(
            difference(padded[i, :k], model(x[i : i + 1, :k]).logits[0])
            for i, k in enumerate(LENGTHS)
        )
    else:
        k = min(LENGTHS)
        pad = difference(forward(model, case, x[:, :k], enc=x), together[:, :k])
    return rows, pad


def check(name: str, built: list[tuple[Case, torch.nn.Module]]) -> Result:
    worst = 0.0
    for case, model in built:
        got = measure(model, case, name)
        if isinstance(got, Result):
            return got
        rows, pad = got
        if not rows <= LIMIT:
            return failed(
                NAME,
                f"a row's outputs change by {rows:.3g} (limit {LIMIT:g}) when other rows share "
                f"its batch: {name} mixes rows",
                "compute over the time and feature axes of each row only (no statistic over the "
                "batch axis, no reshape that merges rows)",
                rows,
                LIMIT,
                case.name,
            )
        if not pad <= LIMIT:
            what = (
                "right-padded rows (padding_mask) differ from the rows alone"
                if families.get(case.family).takes_padding_mask
                else "the first positions of a row differ from the row cut short"
            )
            return failed(
                NAME,
                f"{what} by {pad:.3g} (limit {LIMIT:g}): {name} reads past a row's end",
                "a score part must treat ctx.padding's padded keys and queries as absent; a part "
                "that mixes over time must not read the sequence's length or its last tokens",
                pad,
                LIMIT,
                case.name,
            )
        worst = max(worst, rows, pad)
    return passed(
        NAME,
        f"rows independent of their batch and of padding (max |difference| {worst:.3g}) in "
        f"{len(built)} configs",
        worst,
        LIMIT,
    )
