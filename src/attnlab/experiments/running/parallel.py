"""``--jobs N``: several runs of an experiment at once, each in its own (spawned) process.

Workers take runs in the experiment's order as they free up; their trainer events come back over
a queue to the one progress display. On a CPU each worker gets ``cores / N`` threads (unless the
config says ``train.threads``); with several GPUs each worker sees one of them
(``CUDA_VISIBLE_DEVICES``), so a 4-GPU machine trains four variants at once. Every run still reads
its own fixed schedule, so results equal those of a sequential compare.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_mod
import traceback
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any

from attnlab.experiments.resolve import RunPlan
from attnlab.experiments.running.execute import (
    RunOutcome,
    execute,
    record_failure,
    report_outcome,
)
from attnlab.experiments.running.progress import ExperimentProgress
from attnlab.experiments.spec import EvaluateSpec
from attnlab.parts.plugins import loaded

_EVENTS: Any = None


def _init_worker(events: Any, devices: Any, threads: int | None, plugins: list[str]) -> None:
    global _EVENTS
    _EVENTS = events
    from attnlab.base.warning_lines import install

    install("compare")  # a run's warnings as the parent prints them, one line each
    # the parent's plugins first: the runs' configs hold their parts' options classes
    from attnlab.parts.plugins import load_plugins

    load_plugins(plugins)
    device = devices.get()
    if device is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(device)
    if threads:
        import torch

        torch.set_num_threads(threads)


def _work(r: RunPlan, evaluate: EvaluateSpec | None) -> RunOutcome:
    key = (r.variant, r.seed)
    events = _EVENTS
    events.put(("start", key, r.config.train.max_steps))
    return execute(
        r,
        evaluate,
        lambda ev: events.put(("event", key, ev)),
        lambda msg: events.put(("note", key, msg)),
    )


def _drain(events: Any, progress: ExperimentProgress | None) -> None:
    while True:
        try:
            kind, key, payload = events.get_nowait()
        except queue_mod.Empty:
            return
        if progress is None:
            continue
        if kind == "start":
            progress.start_run(*key, payload)
        elif kind == "event":
            progress.event(*key, payload)
        else:
            progress.note(payload)


def _gpu_ids(jobs: int) -> list[int | None]:
    try:
        import torch

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        n = 0
    if n < 2:
        return [None] * jobs
    return [i % n for i in range(jobs)]


def run_parallel(
    runs: list[RunPlan],
    evaluate: EvaluateSpec | None,
    jobs: int,
    progress: ExperimentProgress | None,
) -> dict[tuple[str, int], RunOutcome]:
    """Execute ``runs`` in ``jobs`` worker processes; outcomes by (variant, seed)."""
    ctx = mp.get_context("spawn")
    events, devices = ctx.Queue(), ctx.Queue()
    jobs = min(jobs, len(runs))
    gpus = _gpu_ids(jobs)
    for g in gpus:
        devices.put(g)
    threads = None if gpus[0] is not None else max(1, (os.cpu_count() or 1) // jobs)
    outcomes: dict[tuple[str, int], RunOutcome] = {}
    with ProcessPoolExecutor(
        jobs,
        mp_context=ctx,
        initializer=_init_worker,
        initargs=(events, devices, threads, [p.spec for p in loaded() if p.distribution is None]),
    ) as pool:
        futures = {pool.submit(_work, r, evaluate): r for r in runs}
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                _drain(events, progress)
                for f in done:
                    r = futures[f]
                    try:
                        out = f.result()
                    except Exception as e:  # the worker process died (e.g. out of memory)
                        reason = record_failure(r.run_dir, e, traceback.format_exc())
                        out = RunOutcome(r.variant, r.seed, "failed", True, reason)
                    outcomes[(r.variant, r.seed)] = out
                    report_outcome(progress, r, out)
        except KeyboardInterrupt:
            for f in pending:
                f.cancel()
            raise
    return outcomes
