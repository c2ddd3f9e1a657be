"""Curves over training, aggregated over seeds.

- validation loss of a variant: at each validation step, mean / min / max over the seeds that
  reached it;
- relative improvement along training (seed 001's Figure 1, bottom): for each seed ``k`` and each
  step ``s`` where both have a validation loss, ``100 (b_k(s) - v_k(s)) / b_k(s)``; then mean /
  min / max over seeds. Pairing by seed keeps the identical-batches design (both read the same
  schedule) instead of comparing two seed averages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass
class Band:
    """A curve with its spread: ``steps``, ``mean``, ``lo`` (min) and ``hi`` (max)."""

    steps: np.ndarray
    mean: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    n: np.ndarray  # how many seeds contribute at each step


def band(curves: Sequence[Sequence[tuple[int, float]]]) -> Band:
    """Aggregate per-seed ``(step, value)`` curves by step."""
    by_step: dict[int, list[float]] = {}
    for c in curves:
        for s, v in c:
            if np.isfinite(v):
                by_step.setdefault(int(s), []).append(float(v))
    steps = np.array(sorted(by_step), dtype=np.int64)
    vals = [np.asarray(by_step[int(s)]) for s in steps]
    return Band(
        steps=steps,
        mean=np.array([v.mean() for v in vals]),
        lo=np.array([v.min() for v in vals]),
        hi=np.array([v.max() for v in vals]),
        n=np.array([v.size for v in vals], dtype=np.int64),
    )


def relative_curve(
    baseline: Mapping[int, Sequence[tuple[int, float]]],
    variant: Mapping[int, Sequence[tuple[int, float]]],
) -> Band:
    """Seed-paired relative improvement ``100 (b - v) / b`` at the shared validation steps."""
    per_seed = []
    for seed, vcurve in variant.items():
        if seed not in baseline:
            continue
        b = dict(baseline[seed])
        per_seed.append([(s, 100.0 * (b[s] - v) / b[s]) for s, v in vcurve if s in b and b[s] != 0])
    return band(per_seed)
