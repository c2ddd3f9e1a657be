"""Where the runs of an experiment execute: ``--launcher local`` (this machine) or a submitit
executor (``--launcher slurm``, :mod:`~attnlab.experiments.running.launch_submitit`).

A launcher takes a list of :class:`~attnlab.experiments.resolve.RunPlan` and returns one
:class:`~attnlab.experiments.running.execute.RunOutcome` per run once they are all over. Every run writes
its own run directory, whichever launcher executes it, so results (and resuming) do not depend
on the launcher.

Local: ``--jobs 1`` trains in this process; ``--jobs N`` in N spawned worker processes
(:mod:`~attnlab.experiments.running.parallel`: CPU cores split between them, or one GPU each on a
multi-GPU machine). With a single GPU the runs go one after another: N processes on one GPU
would share its memory and compute and give no speed-up.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from attnlab.experiments.resolve import RunPlan
from attnlab.experiments.running.execute import RunOutcome, run_here
from attnlab.experiments.running.progress import ExperimentProgress
from attnlab.experiments.spec import EvaluateSpec

Outcomes = dict[tuple[str, int], RunOutcome]


class Launcher(Protocol):
    def check(self, runs: list[RunPlan], out_dir: Path) -> None:
        """Refuse, before anything is written, what this launcher cannot run."""

    def run(
        self,
        runs: list[RunPlan],
        evaluate: EvaluateSpec | None,
        progress: ExperimentProgress | None,
    ) -> Outcomes:
        """Execute ``runs`` (each resuming its run directory); outcomes by (variant, seed)."""


def _uses_cuda(r: RunPlan) -> bool:
    return r.config.train.device == "auto" or r.config.train.device.startswith("cuda")


def cuda_devices() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


def effective_jobs(jobs: int, runs: list[RunPlan]) -> tuple[int, str | None]:
    """``--jobs`` as it can run here: 1 when the runs would share one GPU."""
    if jobs > 1 and any(_uses_cuda(r) for r in runs) and cuda_devices() == 1:
        return 1, f"--jobs {jobs} on one GPU: the runs go one after another"
    return jobs, None


class LocalLauncher:
    """This machine: sequentially in this process, or ``jobs`` worker processes."""

    def __init__(self, jobs: int = 1, say: Callable[[str], None] = lambda m: None) -> None:
        self.jobs = jobs
        self.say = say
        self._told = False

    def check(self, runs: list[RunPlan], out_dir: Path) -> None:
        return None

    def run(
        self,
        runs: list[RunPlan],
        evaluate: EvaluateSpec | None,
        progress: ExperimentProgress | None,
    ) -> Outcomes:
        jobs, why = effective_jobs(self.jobs, runs)
        if why and not self._told:
            self.say(why)
            self._told = True
        if jobs > 1 and len(runs) > 1:
            from attnlab.experiments.running.parallel import run_parallel

            return run_parallel(runs, evaluate, jobs, progress)
        return {(r.variant, r.seed): run_here(r, evaluate, progress) for r in runs}
