"""``--jobs N``: several runs of an experiment at once, each in its own (spawned) process.

Workers take runs in the experiment's order as they free up; their trainer events come back over
a queue to the one progress display. On a CPU each worker gets ``cores / N`` threads (unless the
config says ``train.threads``); with several GPUs each worker sees one of them
(``CUDA_VISIBLE_DEVICES``), so a 4-GPU machine trains four variants at once. Every run still reads
its own fixed schedule, so results equal those of a sequential compare.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue as queue_mod
import signal
import threading
import traceback
import warnings
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
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
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    # started with SIGINT blocked (see _no_sigint): a Ctrl-C that came since is dropped here
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    from attnlab.base.warning_lines import install

    install("compare")  # a run's warnings as the parent prints them, one line each
    from attnlab.base.advice import COMPARE, set_restart

    set_restart(COMPARE)  # a run's advice in compare's terms
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


def _drain(events: Any, progress: ExperimentProgress | None) -> list[tuple[str, Any]]:
    """Hand the workers' events to ``progress``; (kind, run key) of each."""
    seen: list[tuple[str, Any]] = []
    while True:
        try:
            kind, key, payload = events.get_nowait()
        except queue_mod.Empty:
            return seen
        except (EOFError, OSError):  # the queue's pipe went with a killed worker
            return seen
        seen.append((kind, key))
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


#: how many times a run whose worker process was killed is started again
RETRIES = 1


def _stop(pool: ProcessPoolExecutor) -> None:
    """End ``pool`` now: cancel what has not started, terminate the workers (a run resumes from
    its last checkpoint next time), and wait for them and for the pool's manager thread, so
    nothing of the pool runs or prints after.

    The manager thread must be finished before the interpreter exits: Python 3.11's exit hook
    (``concurrent.futures.process._python_exit``) writes to the thread's wakeup pipe without
    the lock the thread holds while closing it, and under load the close lands between the
    hook's "still open?" check and its write ("Exception ignored in: <module 'threading'> ...
    OSError: [Errno 9] Bad file descriptor"; CPython gh-125451, fixed in 3.12.8 only). Once
    the thread has closed the pipe, the hook skips it."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    manager = getattr(pool, "_executor_manager_thread", None)  # shutdown forgets it
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        with contextlib.suppress(Exception):
            proc.terminate()
    for proc in procs:
        with contextlib.suppress(Exception):
            proc.join(timeout=10)
    if manager is not None:
        manager.join(timeout=30)  # it sees the dead workers, then closes its pipes


@contextlib.contextmanager
def _no_sigint() -> Iterator[None]:
    """Ctrl-C held (not lost) while workers start; it raises ``KeyboardInterrupt`` when the
    block ends, and this process then stops the workers itself.

    Two halves, both needed. SIGINT is blocked in this thread, so a spawned interpreter
    starts with it blocked and a Ctrl-C reaches no worker while it imports (no worker
    ``KeyboardInterrupt`` traceback; each worker ignores SIGINT and unblocks it in its
    initializer). And the Python-level handler only records the signal meanwhile: the kernel
    hands a process-wide SIGINT to any thread that has it unblocked (a queue's feeder thread,
    started earlier), and Python then raises ``KeyboardInterrupt`` in the main thread whatever
    its mask, which, landing between a worker's ``fork`` and the write of its start-up data,
    left that worker to die on "EOFError: Ran out of input" and out of the pool's books."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: caught.append(signum))
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # a held one runs now
        signal.signal(signal.SIGINT, previous)
    if caught:
        if callable(previous):
            previous(signal.SIGINT, None)
        elif previous != signal.SIG_IGN:
            raise KeyboardInterrupt


def _quiet_tracker_relaunch() -> None:
    """A resource tracker that multiprocessing starts again (the first was killed) is told to
    forget the semaphores of compare's queues, which it never saw, and prints a ``KeyError``
    traceback for each. Its stderr goes to /dev/null instead; the relaunch itself is one warning
    line. (Installed once per process; CPython's ``ResourceTracker.ensure_running``.)"""
    from multiprocessing import resource_tracker

    tracker = resource_tracker._resource_tracker
    if getattr(tracker, "_attnlab_quiet", False):
        return
    launch = tracker.ensure_running

    def ensure_running() -> None:
        fd = getattr(tracker, "_fd", None)
        if fd is None or tracker._check_alive():
            return launch()
        warnings.warn(
            "the multiprocessing resource tracker died; a new one is started (the semaphores "
            "of compare's queues may leak until the next reboot)",
            stacklevel=2,
        )
        devnull = os.open(os.devnull, os.O_WRONLY)
        saved = os.dup(2)
        try:
            os.dup2(devnull, 2)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                launch()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            os.close(devnull)

    tracker.ensure_running = ensure_running
    tracker._attnlab_quiet = True


def run_parallel(
    runs: list[RunPlan],
    evaluate: EvaluateSpec | None,
    jobs: int,
    progress: ExperimentProgress | None,
) -> dict[tuple[str, int], RunOutcome]:
    """Execute ``runs`` in ``jobs`` worker processes; outcomes by (variant, seed).

    A worker process that dies (killed, out of memory) breaks the pool: the runs it was
    training are started again in a fresh pool (they resume from their checkpoints), at most
    :data:`RETRIES` times each, then reported failed alone; runs that had not started are simply
    started again. Ctrl-C stops every worker and raises ``KeyboardInterrupt`` here."""
    _quiet_tracker_relaunch()
    ctx = mp.get_context("spawn")
    events, devices = ctx.Queue(), ctx.Queue()
    jobs = min(jobs, len(runs))
    gpus = _gpu_ids(jobs)
    threads = None if gpus[0] is not None else max(1, (os.cpu_count() or 1) // jobs)
    plugins = [p.spec for p in loaded() if p.distribution is None]
    outcomes: dict[tuple[str, int], RunOutcome] = {}
    tries: dict[tuple[str, int], int] = {}
    todo = list(runs)
    while todo:
        while not devices.empty():  # a broken pool's workers took theirs with them
            with contextlib.suppress(queue_mod.Empty):
                devices.get_nowait()
        for g in gpus[: min(jobs, len(todo))]:
            devices.put(g)
        todo = _one_pool(
            ctx, todo, evaluate, jobs, progress, events, devices, threads, plugins, outcomes, tries
        )
    return outcomes


def _one_pool(
    ctx, runs, evaluate, jobs, progress, events, devices, threads, plugins, outcomes, tries
) -> list[RunPlan]:
    """Run ``runs`` in one pool; the runs to start again when a worker died."""
    started: set[tuple[str, int]] = set()

    def drain() -> None:
        for kind, key in _drain(events, progress):
            if kind == "start":
                started.add(key)

    again: list[RunPlan] = []
    pool = ProcessPoolExecutor(
        min(jobs, len(runs)),
        mp_context=ctx,
        initializer=_init_worker,
        initargs=(events, devices, threads, plugins),
    )
    try:
        with _no_sigint():
            futures = {pool.submit(_work, r, evaluate): r for r in runs}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            drain()
            for f in done:
                r = futures[f]
                key = (r.variant, r.seed)
                try:
                    out = f.result()
                except BrokenProcessPool as e:  # a worker process died (killed, out of memory)
                    if key not in started:
                        again.append(r)  # it never ran: not its fault
                        continue
                    tries[key] = tries.get(key, 0) + 1
                    if tries[key] <= RETRIES:
                        if progress is not None:
                            progress.note(
                                f"{r.variant} seed {r.seed}: its worker process died; "
                                "starting it again (it resumes from its checkpoint)"
                            )
                        again.append(r)
                        continue
                    reason = record_failure(
                        r.run_dir,
                        RuntimeError(f"its worker process died {tries[key]} times ({e})"),
                        traceback.format_exc(),
                    )
                    out = RunOutcome(r.variant, r.seed, "failed", True, reason)
                except Exception as e:
                    reason = record_failure(r.run_dir, e, traceback.format_exc())
                    out = RunOutcome(r.variant, r.seed, "failed", True, reason)
                outcomes[key] = out
                report_outcome(progress, r, out)
    except KeyboardInterrupt:
        _stop(pool)
        raise
    pool.shutdown(wait=True)
    drain()
    return again
