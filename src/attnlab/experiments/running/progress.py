"""Progress of a whole experiment: runs done / total, the current run's step and loss, and the ETA
of everything that is left.

ETA model: a run's wall time is ``steps x seconds-per-step`` (evaluation and checkpoints
included, measured from the trainer's own clock) plus the mean measured per-run overhead (setup
outside the step loop); with ``jobs`` runs at a time the total is divided by ``jobs`` (but is never
less than the longest single run). A variant with a measured run uses its own
rate; an unmeasured one uses the measured rates scaled by forward FLOPs per token,
``rate_v = mean_u(rate_u / flops_u) x flops_v``. Before any step is measured there is no ETA.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TextIO

from attnlab.runs.progress import ProgressEvent


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

    def remaining(self, work: Iterable[tuple[str, int, bool]], jobs: int = 1) -> float | None:
        """Seconds for ``(variant, steps left, started)`` items run ``jobs`` at a time (a started
        run has paid its setup); None while some rate is unknown."""
        times = []
        overhead = sum(self.overheads) / len(self.overheads) if self.overheads else 0.0
        for variant, steps, started in work:
            if steps <= 0:
                continue
            r = self.rate(variant)
            if r is None:
                return None
            times.append(r * steps + (0.0 if started else overhead))
        if not times:
            return 0.0
        return max(sum(times) / max(jobs, 1), max(times))


@dataclass
class _Current:
    variant: str
    seed: int
    max_steps: int
    step: int = 0
    loss: float | None = None
    val_loss: float | None = None


class ExperimentProgress:
    """Receives the runner's calls and the trainers' events; draws a rich display on a terminal,
    plain log lines otherwise (``stream``). Several runs may be in progress (``--jobs``)."""

    def __init__(
        self,
        total_runs: int,
        flops: dict[str, float],
        *,
        jobs: int = 1,
        rich: bool | None = None,
        stream: TextIO | None = None,
        log_every: int = 50,
    ) -> None:
        self.total = total_runs
        self.jobs = jobs
        self.done = 0
        self.eta = EtaModel(flops)
        self.pending: list[tuple[str, int]] = []
        self.active: dict[tuple[str, int], _Current] = {}
        self.paused: dict[tuple[str, int], int] = {}  # stopped at a pruning step: steps left
        self.stream = stream
        self.log_every = max(1, log_every)
        out = stream or sys.stderr
        self.rich = out.isatty() if rich is None else rich
        self._progress = None
        self._exp_task = None
        self._tasks: dict[tuple[str, int], object] = {}

    # ---------------------------------------------------------------------------- runner calls
    def begin(self, plan: list[tuple[str, int, int]]) -> None:
        """``plan``: (variant, seed, steps left) of every run to do, in order."""
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
        key = (variant, seed)
        self.active[key] = _Current(variant, seed, max_steps)
        if self.paused.pop(key, None) is None:
            for i, (v, _) in enumerate(self.pending):
                if v == variant:
                    del self.pending[i]
                    break
        label = f"{variant} seed{seed}"
        if self._progress is not None:
            from rich.markup import escape

            # a variant's name is text: "[ratio=0.25]" in it is not markup to apply
            self._tasks[key] = self._progress.add_task(escape(label), total=max_steps, info="")
            self._refresh()
        else:
            self._say(f"[{self.done + len(self.active)}/{self.total}] {label}: starting")

    def __call__(self, ev: ProgressEvent) -> None:
        """The trainer's progress callback when one run is in progress."""
        if len(self.active) == 1:
            self.event(*next(iter(self.active)), ev)

    def event(self, variant: str, seed: int, ev: ProgressEvent) -> None:
        """A trainer event of the run (variant, seed)."""
        cur = self.active.get((variant, seed))
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
            eta = fmt_duration(self.remaining())
            self._say(f"  {self._run_info(cur)}  | experiment ETA {eta}")

    def end_run(
        self,
        variant: str,
        seed: int,
        status: str,
        detail: str = "",
        overhead: float | None = None,
    ) -> None:
        self.done += 1
        if overhead is not None:
            self.eta.record_overhead(overhead)
        key = (variant, seed)
        self.active.pop(key, None)
        self.paused.pop(key, None)
        msg = f"[{self.done}/{self.total}] {variant} seed{seed}: {status}"
        msg += f" ({detail})" if detail else ""
        if self._progress is not None:
            task = self._tasks.pop(key, None)
            if task is not None:
                self._progress.remove_task(task)
            self._progress.console.print(msg, markup=False)  # names and reasons are text
            self._refresh()
        else:
            self._say(f"{msg}  | experiment ETA {fmt_duration(self.remaining())}")

    def pause_run(self, variant: str, seed: int, steps_left: int) -> None:
        """The run stopped at a pruning step; it resumes (or is pruned) after the whole grid got
        there. Not counted as done."""
        key = (variant, seed)
        cur = self.active.pop(key, None)
        self.paused[key] = steps_left
        if self._progress is not None:
            task = self._tasks.pop(key, None)
            if task is not None:
                self._progress.remove_task(task)
            self._refresh()
        elif cur is not None:
            self._say(f"  {self._run_info(cur)}  (paused for the pruning decision)")

    def finish(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def note(self, message: str) -> None:
        if self._progress is not None:
            self._progress.console.print(message, markup=False)
        else:
            self._say(message)

    # ------------------------------------------------------------------------------- helpers
    def remaining(self) -> float | None:
        work = [(c.variant, c.max_steps - c.step, True) for c in self.active.values()]
        work += [(v, steps, True) for (v, _), steps in self.paused.items()]
        work += [(v, steps, False) for v, steps in self.pending]
        return self.eta.remaining(work, self.jobs)

    @staticmethod
    def _run_info(cur: _Current) -> str:
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
        for key, cur in self.active.items():
            task = self._tasks.get(key)
            if task is None:
                continue
            info = []
            if cur.loss is not None:
                info.append(f"loss {cur.loss:.4f}")
            if cur.val_loss is not None:
                info.append(f"val {cur.val_loss:.4f}")
            self._progress.update(task, completed=cur.step, info="  ".join(info))

    def _say(self, line: str) -> None:
        print(line, file=self.stream or sys.stderr, flush=True)
