"""The battery's ``coord_check`` property: the part's small model under µP at widths 32, 64 and
128 (heads of 8, their number and the K/V heads' grown with the width) passes the coordinate
check (:func:`attnlab.testing.coord_check.coordinate_check`): no activation, nor its change over
3 Adam steps, grows faster than width^0.25. A part whose weights are mis-declared (or whose
forward carries a width-dependent factor) fails, naming the first module that grows and its
weights. Run on the base case (the default family's first small model) when it is the decoder
(the check trains on next-token loss). Cost: 3 widths x 2 seeds x 5 passes of 2-layer models,
about a second.
"""

from __future__ import annotations

from attnlab.parts import families
from attnlab.testing.cases import Case, config_for
from attnlab.testing.coord_check import coordinate_check
from attnlab.testing.result import Result, failed, passed, skipped

NAME = "coord_check"
WIDTHS = (32, 64, 128)
HEAD_DIM = 8


def width_sets(width: int) -> tuple[str, ...]:
    """The ``--set`` items of the battery's model at ``width``: heads of 8, 4 per 32 of width,
    half as many K/V heads (the base case's GQA)."""
    heads = width // HEAD_DIM
    return (
        f"model.d_model={width}",
        f"model.attention.n_heads={heads}",
        f"model.attention.n_kv_heads={max(1, heads // 2)}",
        f"model.attention.head_dim={HEAD_DIM}",
    )


def check(name: str, slot: str, kind: str, options: dict, case: Case) -> Result:
    """The coordinate check of ``slot.kind`` (with ``options``) in ``case``'s model."""
    family = families.get(case.family)
    if not family.causal_lm or family.data_needs:
        return skipped(
            NAME,
            f"runs on causal LMs that need no extra inputs; {name}'s first case is {case.name}",
        )

    def make(width: int):
        return config_for(case, slot, kind, options, width_sets(width)).model

    result = coordinate_check(make, WIDTHS)
    worst = max((result.growth(n) for n in result.order), default=0.0)
    if result.passed:
        return passed(NAME, result.message(), measured=worst, limit=result.threshold)
    return failed(
        NAME,
        result.message(),
        "attnlab.testing.coord_check.coordinate_check in pytest shows every module's exponent",
        measured=worst,
        limit=result.threshold,
        where=case.name,
    )
