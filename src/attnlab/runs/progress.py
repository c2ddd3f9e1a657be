"""How a training run reports progress: a callable that receives :class:`ProgressEvent`.

``train(..., progress=None)`` is silent (what the compare runner wants); the CLI passes
:func:`console_reporter`, a rich progress bar on a terminal and plain log lines otherwise.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TextIO

EventKind = Literal["start", "step", "eval", "end"]


@dataclass(frozen=True)
class ProgressEvent:
    """One report from the trainer (rank 0 only). ``step`` counts finished optimizer steps."""

    kind: EventKind
    step: int
    max_steps: int
    loss: float | None = None
    val_loss: float | None = None
    lr: float | None = None
    tokens: int = 0
    tokens_per_s: float | None = None
    elapsed: float = 0.0
    eta_s: float | None = None
    message: str = ""
    #: the ``metrics.jsonl`` row written at this step, if one was (every column, for trackers)
    metrics: dict[str, Any] | None = None
    #: at ``end``: the run's final ``status.json`` content
    status: dict[str, Any] | None = None


ProgressFn = Callable[[ProgressEvent], None]


def _fmt_eta(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(seconds)
    return f"{s // 3600:d}:{s // 60 % 60:02d}:{s % 60:02d}"


class RichProgress:
    """A rich progress bar on stderr with loss, val loss, tokens/s and ETA."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self._progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}", markup=False),  # messages name paths
            console=Console(stderr=True),
            transient=False,
        )
        self._task = None

    def __call__(self, ev: ProgressEvent) -> None:
        if ev.kind == "start":
            self._progress.start()
            self._task = self._progress.add_task(
                "train", total=ev.max_steps, completed=ev.step, info=ev.message
            )
            return
        if self._task is None:
            return
        parts = []
        if ev.loss is not None:
            parts.append(f"loss {ev.loss:.4f}")
        if ev.val_loss is not None:
            parts.append(f"val {ev.val_loss:.4f}")
        if ev.tokens_per_s:
            parts.append(f"{ev.tokens_per_s:,.0f} tok/s")
        parts.append(f"ETA {_fmt_eta(ev.eta_s)}")
        if ev.message:
            parts.append(ev.message)
        self._progress.update(self._task, completed=ev.step, info="  ".join(parts))
        if ev.kind == "end":
            self._progress.stop()
            self._task = None


class LinePrinter:
    """Plain log lines every ``every`` steps, at evaluations and at the end (for logs and pipes)."""

    def __init__(self, every: int, stream: TextIO | None = None) -> None:
        self.every = max(1, every)
        self.stream = stream

    def __call__(self, ev: ProgressEvent) -> None:
        out = self.stream or sys.stderr
        if ev.kind == "start":
            print(f"train: step {ev.step}/{ev.max_steps} {ev.message}".rstrip(), file=out)
            return
        row = ev.metrics or {}
        compiled, first = row.get("compile_s"), row.get("first_step_s")
        if ev.kind == "end" or (ev.kind == "step" and ev.step % self.every and not first):
            return  # the caller prints its own summary at the end
        line = f"step {ev.step:>7d}/{ev.max_steps}"
        if ev.loss is not None:
            line += f"  loss {ev.loss:.4f}"
        if ev.val_loss is not None:
            line += f"  val {ev.val_loss:.4f}"
        if ev.lr is not None:
            line += f"  lr {ev.lr:.2e}"
        if ev.tokens_per_s:
            line += f"  {ev.tokens_per_s:,.0f} tok/s"
        line += f"  ETA {_fmt_eta(ev.eta_s)}"
        if first:  # the session's first step compiled: its cost, reported apart
            line += f"  first step {first:.1f} s"
            if compiled:
                line += f" (compiling {compiled:.1f} s, kept out of tok/s)"
            if row.get("fxgraph_cache_hit") is not None:
                hit, miss = row["fxgraph_cache_hit"], row["fxgraph_cache_miss"]
                line += f"  inductor cache: {hit} graphs read, {miss} compiled"
        if ev.message:
            line += f"  {ev.message}"
        print(line, file=out, flush=True)


def console_reporter(log_every: int) -> ProgressFn:
    """A rich bar when stderr is a terminal, plain lines otherwise."""
    return RichProgress() if sys.stderr.isatty() else LinePrinter(log_every)
