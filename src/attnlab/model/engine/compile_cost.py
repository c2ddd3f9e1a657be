"""What compiling the engine's kernels costs, counted apart and paid once (issue 34).

A compiled FlexAttention kernel is built on its first call per shape (minutes on a loaded CPU,
seconds on CUDA). :func:`timed_first_call` times those first calls and :func:`compile_seconds`
is their total in this process, which the run loop reports beside the session's first step
(``metrics.jsonl``: ``first_step_s``, ``compile_s``; the progress line) and ``attnlab bench``
can subtract. :func:`use_inductor_cache` points inductor's on-disk caches (its kernels and the
FX graph cache) at one directory that outlives the run, so a second run's first step reads the
kernels instead of building them: ``TORCHINDUCTOR_CACHE_DIR`` when the user set it, else
``$ATTNLAB_CACHE/inductor`` or ``~/.cache/attnlab/inductor``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_seen: set[Any] = set()
_total = [0.0]


def timed_first_call(key: Any, fn: Callable[[], Any]) -> Any:
    """``fn()``, its wall time added to :func:`compile_seconds` the first time ``key`` runs."""
    if key in _seen:
        return fn()
    t0 = time.perf_counter()
    out = fn()
    _total[0] += time.perf_counter() - t0
    _seen.add(key)
    return out


def compile_seconds() -> float:
    """Seconds this process spent in first (compiling) calls of the engine's kernels."""
    return _total[0]


def use_inductor_cache(root: str | Path | None = None) -> Path:
    """Inductor's on-disk caches under one lasting directory (created); returns it."""
    import torch._inductor.config as inductor

    where = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if where is None:
        base = root or os.environ.get("ATTNLAB_CACHE") or Path.home() / ".cache" / "attnlab"
        where = str(Path(base) / "inductor")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = where
    inductor.fx_graph_cache = True
    Path(where).mkdir(parents=True, exist_ok=True)
    return Path(where)
