"""``attnlab compare --launcher slurm``: every run a submitit job, the report when all are over.

The runs go out as one job array (``executor.map_array``); each job calls the same
:func:`~attnlab.experiments.running.execute.execute` as the local launcher, so it writes (or resumes) the
same run directory and returns the same :class:`~attnlab.experiments.running.execute.RunOutcome`. This
process then waits for the jobs (``submitit.helpers.as_completed``) and collects their outcomes; a
job that dies without one (killed, out of memory, timed out) is recorded as ``failed`` in its run
directory, and rerunning the command resumes it from its last checkpoint. A job that reaches its
time limit is requeued by submitit and resumes from that checkpoint (:class:`RunJob`).

Clusters (submitit's ``AutoExecutor(cluster=...)``): ``slurm`` (``--launcher slurm``), and
``local`` (``--launcher submitit-local``: each job a subprocess of this machine, all started at
once; for trying the submitit path without a cluster). Executor parameters come from
``--launcher-arg KEY=VALUE`` (``executor.update_parameters``), e.g. ``slurm_partition=gpu``,
``gpus_per_node=1``, ``cpus_per_task=8``, ``timeout_min=240``, ``mem_gb=32``; ``--jobs N``
becomes ``slurm_array_parallelism`` (at most N runs at once). The experiment directory and the
prepared data must be on a filesystem the compute nodes share.
"""

from __future__ import annotations

import shutil
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attnlab.base.errors import UserError
from attnlab.config import parse_override
from attnlab.experiments.resolve import RunPlan
from attnlab.experiments.running.execute import (
    RunOutcome,
    execute,
    record_failure,
    report_outcome,
)
from attnlab.experiments.running.launch import Outcomes
from attnlab.experiments.running.progress import ExperimentProgress
from attnlab.experiments.spec import EvaluateSpec

INSTALL = 'pip install "submitit>=1.5"'
#: --launcher name -> submitit cluster
CLUSTERS = {"slurm": "slurm", "submitit-local": "local"}
DEFAULT_TIMEOUT_MIN = 240
SUBMITIT_DIR = "submitit"


def import_submitit() -> Any:
    """submitit, or a UserError with the install line."""
    try:
        import submitit
    except ImportError:
        raise UserError(
            "this launcher needs submitit, which is not installed. Install it with:\n"
            f"  {INSTALL}\n"
            '(or the extra: pip install -c constraints.txt -e ".[slurm]" in an attnlab checkout)'
        ) from None
    return submitit


class RunJob:
    """One run as a submitit job. ``checkpoint`` makes it requeue on a timeout (submitit calls it
    on the time-limit signal): the requeued job resumes from the trainer's last checkpoint."""

    def __call__(self, r: RunPlan, evaluate: EvaluateSpec | None) -> RunOutcome:
        return execute(r, evaluate, None, lambda m: print(m, flush=True))

    def checkpoint(self, r: RunPlan, evaluate: EvaluateSpec | None) -> Any:
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self, r, evaluate)


def parse_launcher_args(items: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` items (values read as TOML, else strings) for ``update_parameters``."""
    out: dict[str, Any] = {}
    for item in items:
        path, value = parse_override(item)
        out[".".join(path)] = value
    return out


class SubmititLauncher:
    """Runs as jobs of a submitit executor (module docstring)."""

    def __init__(
        self,
        launcher: str,
        folder: Path,
        params: dict[str, Any] | None = None,
        jobs: int = 1,
        poll_s: float | None = None,
        say: Callable[[str], None] = lambda m: None,
    ) -> None:
        if launcher not in CLUSTERS:
            raise UserError(f"--launcher {launcher!r}: use local, {', '.join(CLUSTERS)}")
        self.cluster = CLUSTERS[launcher]
        self.folder = Path(folder)
        self.params = dict(params or {})
        self.jobs = jobs
        self.poll_s = poll_s if poll_s is not None else (1.0 if self.cluster == "local" else 30.0)
        self.say = say
        self.submitit = import_submitit()

    def check(self, runs: list[RunPlan], out_dir: Path) -> None:
        if self.cluster == "slurm" and shutil.which("sbatch") is None:
            raise UserError(
                "--launcher slurm: no sbatch on PATH, so this is not a Slurm login node. Run "
                "from one, or use --launcher local (add --jobs N to train N runs at once)"
            )
        self._executor()  # unknown --launcher-arg keys fail here, before anything is written

    def _executor(self) -> Any:
        ex = self.submitit.AutoExecutor(folder=self.folder, cluster=self.cluster)
        params = {"timeout_min": DEFAULT_TIMEOUT_MIN, "name": "attnlab", **self.params}
        if self.cluster == "slurm":
            params.setdefault("slurm_array_parallelism", self.jobs)
        try:
            ex.update_parameters(**params)
        except (NameError, ValueError, AssertionError, TypeError) as e:
            raise UserError(
                f"--launcher-arg: submitit refused the executor parameters ({e}); see "
                "submitit's AutoExecutor.update_parameters for the valid names"
            ) from None
        return ex

    def run(
        self,
        runs: list[RunPlan],
        evaluate: EvaluateSpec | None,
        progress: ExperimentProgress | None,
    ) -> Outcomes:
        if not runs:
            return {}
        ex = self._executor()
        if self.cluster == "local" and self.jobs > 1:
            self.say("submitit's local executor starts every job at once; --jobs is not applied")
        jobs = ex.map_array(RunJob(), runs, [evaluate] * len(runs))
        by_id = {j.job_id: r for j, r in zip(jobs, runs)}
        self.say(
            f"submitted {len(jobs)} {self.cluster} jobs ({jobs[0].job_id} ...); logs in "
            f"{self.folder}; waiting for them"
        )
        if progress is not None:
            for r in runs:
                progress.start_run(r.variant, r.seed, r.config.train.max_steps)
        outcomes: Outcomes = {}
        t0 = time.perf_counter()
        try:
            for job in self.submitit.helpers.as_completed(jobs, poll_frequency=self.poll_s):
                r = by_id[job.job_id]
                try:
                    out = job.result()
                except Exception as e:  # the job died without an outcome
                    reason = record_failure(r.run_dir, e, traceback.format_exc())
                    out = RunOutcome(
                        r.variant, r.seed, "failed", True, f"job {job.job_id}: {reason}"
                    )
                outcomes[(r.variant, r.seed)] = out
                report_outcome(progress, r, out)
        except KeyboardInterrupt:
            left = [
                j.job_id
                for j in jobs
                if (by_id[j.job_id].variant, by_id[j.job_id].seed) not in outcomes
            ]
            self.say(
                f"stopped waiting after {time.perf_counter() - t0:.0f} s; {len(left)} jobs are "
                f"still queued or running ({', '.join(left[:5])}{' ...' if len(left) > 5 else ''})"
                ". Wait for them to end, then `attnlab report` the --out directory (or cancel "
                "them and rerun compare, which resumes every run from its checkpoint)"
            )
            raise
        return outcomes
