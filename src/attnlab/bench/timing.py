"""Wall-clock timing that survives a noisy machine: warmup excluded, subjects interleaved, medians.

Every round runs each subject once, in the same order (A B C D, A B C D, ...), so a slow spell on a
shared machine hits all subjects alike instead of one. A subject's figure is the median over rounds;
a ratio to the reference is the median of the per-round ratios (paired), which cancels load that
drifts between rounds better than a ratio of medians.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch


def synchronize(device: torch.device | str) -> None:
    """Wait for queued device work (CUDA kernels run asynchronously); no-op on CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Samples:
    """Per-round seconds of one subject."""

    seconds: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds) if self.seconds else float("nan")

    @property
    def low(self) -> float:
        return min(self.seconds) if self.seconds else float("nan")

    @property
    def high(self) -> float:
        return max(self.seconds) if self.seconds else float("nan")


def interleaved(
    fns: dict[str, Callable[[], float]],
    rounds: int,
    warmup: int = 1,
    failed: dict[str, str] | None = None,
) -> dict[str, Samples]:
    """Run ``warmup`` untimed rounds, then ``rounds`` timed rounds of every ``fns[name]()`` in turn.

    Each function does its own timing and returns seconds (so it can exclude setup it must redo).
    With ``failed``, a function that raises is recorded there (name -> the error) and dropped from
    the later rounds and from the result; without it the error propagates.
    """
    live = dict(fns)
    out = {name: Samples() for name in fns}

    def call(name: str) -> float | None:
        if failed is None:
            return live[name]()
        try:
            return live[name]()
        except Exception as e:  # one subject's error must not stop the others' timing
            failed[name] = error_text(e)
            del live[name], out[name]
            return None

    for _ in range(warmup):
        for name in list(live):
            call(name)
    for _ in range(rounds):
        for name in list(live):
            seconds = call(name)
            if seconds is not None:
                out[name].seconds.append(seconds)
    return out


def error_text(e: BaseException) -> str:
    """An exception as one line for a table: its type and message."""
    return " ".join(f"{type(e).__name__}: {e}".split())[:300]


def paired_ratio(a: Samples, ref: Samples) -> float:
    """Median over rounds of a[i] / ref[i] (time ratio; > 1 means slower than the reference)."""
    pairs: Sequence[float] = [x / y for x, y in zip(a.seconds, ref.seconds) if y > 0]
    return statistics.median(pairs) if pairs else float("nan")
