"""What compiling has cost this process so far, and what inductor's caches served.

``compile_seconds()`` = the attention engine's first (compiling) kernel calls
(:func:`attnlab.model.engine.compile_cost.compile_seconds`) + dynamo's own compile time
(``torch._dynamo.utils.calculate_time_spent()["total_wall_time"]``: frame and backward
compiles, inductor's code generation inside them) when something is ``torch.compile``d. The run
loop and ``attnlab bench`` take the difference over a session's first step. ``cache_counts()``
= inductor's FX graph cache hits and misses (``torch._dynamo.utils.counters["inductor"]``): a
second run in the same ``TORCHINDUCTOR_CACHE_DIR`` reads its graphs (hits) instead of compiling
them (misses). Cost: a dictionary read each.
"""

from __future__ import annotations

from attnlab.model.engine import compile_cost


def _dynamo_seconds() -> float:
    import sys

    utils = sys.modules.get("torch._dynamo.utils")  # never compiled: nothing was spent
    if utils is None:
        return 0.0
    return float(utils.calculate_time_spent().get("total_wall_time", 0.0))


def compile_seconds() -> float:
    """Seconds this process has spent compiling (the engine's kernels and torch.compile)."""
    return compile_cost.compile_seconds() + _dynamo_seconds()


def cache_counts() -> tuple[int, int]:
    """(hits, misses) of inductor's FX graph cache in this process so far."""
    import sys

    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return 0, 0
    c = utils.counters["inductor"]
    return int(c["fxgraph_cache_hit"]), int(c["fxgraph_cache_miss"])
