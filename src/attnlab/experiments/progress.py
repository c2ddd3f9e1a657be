"""Progress of a whole experiment: runs done / total, the current run's step and loss, and the ETA
of everything that is left.

ETA model: a run's wall time is ``steps x seconds-per-step`` (evaluation and checkpoints
included, measured from the trainer's own clock) plus the mean measured per-run overhead (setup
outside the step loop). A variant with a measured run uses its own
rate; an unmeasured one uses the measured rates scaled by forward FLOPs per token,
``rate_v = mean_u(rate_u / flops_u) x flops_v``. Before any step is measured there is no ETA.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TextIO

from attnlab.train.progress import ProgressEvent


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = max(0, int(round(seconds)))
    return f"{s // 3600:d}:{s // 60 % 60:02d}:{s % 60:02d}"


@dataclass
class EtaModel:
    """Seconds per optimizer step, measured per variant, to estimate the remaining time."""

    flops: dict[str, float]
    rates: dict[str, float] = field(default_factory=dict)
    overheads: list[float] = field(default_factory=list)

    def record_overhead(self, seconds: float) -> None:
        """Per-run time outside the step loop (data, model build, final checkpoint)."""
        self.overheads.append(max(0.0, seconds))

    def record(self, variant: str, seconds_per_step: float) -> None:
        if seconds_per_step > 0:
            self.rates[variant] = seconds_per_step

    def rate(self, variant: str) -> float | None:
        if variant in self.rates:
            return self.rates[variant]
        known = [v for v in self.rates if self.flops.get(v)]
        if not known or not self.flops.get(variant):
            return None
        per_flop = sum(self.rates[v] / self.flops[v] for v in known) / len(known)
        return per_flop * self.flops[variant]

    def remaining(
        self, work: Iterable[tuple[str, int]], first_in_progress: bool = False
    ) -> float | None:
        """Seconds for ``(variant, steps left)`` pairs (``first_in_progress``: the first one has
        started, so its setup is paid); None while some rate is unknown."""
        total = 0.0
        overhead = sum(self.overheads) / len(self.overheads) if self.overheads else 0.0
        for i, (variant, steps) in enumerate(work):
            if steps <= 0:
                continue
            if i > 0 or not first_in_progress:
                total += overhead
            r = self.rate(variant)
            if r is None:
                return None
            total += r * steps
        return total


@dataclass
class _Current:
    variant: str
    seed: int
    max_steps: int
    step: int = 0
    loss: float | None = None
    val_loss: float | None = None


class ExperimentProgress:
    """Receives the runner's calls and the trainer's events; draws a rich display on a terminal,
    plain log lines otherwise (``stream``)."""

    def __init__(
        self,
        total_runs: int,
        flops: dict[str, float],
        *,
        rich: bool | None = None,
        stream: TextIO | None = None,
        log_every: int = 50,
    ) -> None:
        self.total = total_runs
        self.done = 0
        self.eta = EtaModel(flops)
        self.pending: list[tuple[str, int]] = []
        self.current: _Current | None = None
        self.stream = stream
        self.log_every = max(1, log_every)
        out = stream or sys.stderr
        self.rich = out.isatty() if rich is None else rich
        self._progress = None
        self._exp_task = self._run_task = None

    # ---------------------------------------------------------------------------- runner calls
    def begin(self, plan: list[tuple[str, int, int]]) -> None:
        """``plan``: (variant, seed, steps) of every run to do, in order."""
        self.pending = [(v, steps) for v, _, steps in plan]
        if self.rich:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                console=Console(file=self.stream or sys.stderr),
            )
            self._progress.start()
            self._exp_task = self._progress.add_task(
                "[bold]experiment", total=self.total, info="ETA ?"
            )

    def start_run(self, variant: str, seed: int, max_steps: int) -> None:
        self.current = _Current(variant, seed, max_steps)
        if self.pending:
            self.pending.pop(0)
        label = f"{variant} seed{seed}"
        if self._progress is not None:
            if self._run_task is not None:
                self._progress.remove_task(self._run_task)
            self._run_task = self._progress.add_task(label, total=max_steps, info="")
            self._refresh()
        else:
            self._say(f"[{self.done + 1}/{self.total}] {label}: starting")

    def __call__(self, ev: ProgressEvent) -> None:
        """The trainer's progress callback for the current run."""
        cur = self.current
        if cur is None:
            return
        cur.step, cur.max_steps = ev.step, ev.max_steps
        if ev.loss is not None:
            cur.loss = ev.loss
        if ev.val_loss is not None:
            cur.val_loss = ev.val_loss
        if ev.step > 0 and ev.elapsed > 0 and ev.kind in ("step", "eval"):
            self.eta.record(cur.variant, ev.elapsed / ev.step)
        if self._progress is not None:
            self._refresh()
        elif ev.kind == "eval" or (ev.kind == "step" and ev.step % self.log_every == 0):
            self._say(f"  {self._run_info()}  | experiment ETA {fmt_duration(self.remaining())}")

    def end_run(self, status: str, detail: str = "", overhead: float | None = None) -> None:
        self.done += 1
        if overhead is not None:
            self.eta.record_overhead(overhead)
        cur = self.current
        label = f"{cur.variant} seed{cur.seed}" if cur else "run"
        self.current = None
        msg = f"[{self.done}/{self.total}] {label}: {status}" + (f" ({detail})" if detail else "")
        if self._progress is not None:
            if self._run_task is not None:
                self._progress.remove_task(self._run_task)
                self._run_task = None
            self._progress.console.print(msg)
            self._refresh()
        else:
            eta = fmt_duration(self.remaining())
            self._say(f"{msg}  | experiment ETA {eta}")

    def finish(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def note(self, message: str) -> None:
        if self._progress is not None:
            self._progress.console.print(message)
        else:
            self._say(message)

    # ------------------------------------------------------------------------------- helpers
    def remaining(self) -> float | None:
        work = list(self.pending)
        if self.current is not None:
            work.insert(0, (self.current.variant, self.current.max_steps - self.current.step))
        return self.eta.remaining(work, first_in_progress=self.current is not None)

    def _run_info(self) -> str:
        cur = self.current
        if cur is None:
            return ""
        parts = [f"{cur.variant} seed{cur.seed}: step {cur.step}/{cur.max_steps}"]
        if cur.loss is not None:
            parts.append(f"loss {cur.loss:.4f}")
        if cur.val_loss is not None:
            parts.append(f"val {cur.val_loss:.4f}")
        return "  ".join(parts)

    def _refresh(self) -> None:
        assert self._progress is not None
        self._progress.update(
            self._exp_task,
            completed=self.done,
            info=f"ETA {fmt_duration(self.remaining())}",
        )
        cur = self.current
        if cur is not None and self._run_task is not None:
            info = []
            if cur.loss is not None:
                info.append(f"loss {cur.loss:.4f}")
            if cur.val_loss is not None:
                info.append(f"val {cur.val_loss:.4f}")
            self._progress.update(self._run_task, completed=cur.step, info="  ".join(info))

    def _say(self, line: str) -> None:
        print(line, file=self.stream or sys.stderr, flush=True)
