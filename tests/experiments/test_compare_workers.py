"""``attnlab compare --jobs N`` when its worker processes are killed or the user presses Ctrl-C
(issue 24): a killed worker's run is started again (it resumes from its checkpoint) and the
other runs are not blamed; SIGINT at any moment ends with "interrupted" and no traceback."""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

import attnlab
from tests.helpers.data import tiny_experiment

SRC = str(Path(attnlab.__file__).resolve().parents[1])
THREE = '[[variants]]\nname = "a"\n[[variants]]\nname = "b"\nset = ["train.lr=0.002"]\n'


def _start(exp: Path, out: Path, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    with _sigint_handled():
        return _popen(exp, out, env, *extra)


@contextlib.contextmanager
def _sigint_handled() -> Iterator[None]:
    """SIGINT handled here while compare starts, so compare starts with its default (a
    background shell starts the suite with SIGINT ignored, and children inherit that: the
    Ctrl-C these tests send would then be ignored, not tested)."""
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def _popen(exp: Path, out: Path, env: dict[str, str], *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "attnlab",
            "compare",
            str(exp),
            "--out",
            str(out),
            "--quiet",
            "--skip-check",
            *extra,
        ],
        cwd=exp.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's Ctrl-C reaches it
    )


def _children_with(pid: int, marker: bytes) -> list[int]:
    """The processes ``pid`` started whose command line holds ``marker``."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if int(fields[1]) == pid and marker in cmd:
                out.append(int(d.name))
    return out


def _children(pid: int) -> list[int]:
    """compare's worker processes."""
    return _children_with(pid, b"spawn_main")


@pytest.fixture
def experiment(data_dir, tmp_path) -> Path:
    path = tiny_experiment(tmp_path / "exp.toml", data_dir, THREE, seeds="[0, 1]")
    path.write_text(path.read_text().replace("steps = 10\n", "steps = 60\n"))  # long enough
    return path


def _wait_for(p: subprocess.Popen, ready, timeout: float = 240) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline and p.poll() is None:
        if ready():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("when", ["workers-starting", "training"])
def test_sigint_to_compare_jobs_2_is_clean_at_any_moment(experiment, tmp_path, when):
    out_dir = tmp_path / "out"
    p = _start(experiment, out_dir, "--jobs", "2")
    if when == "workers-starting":  # the workers exist and are still importing torch
        assert _wait_for(p, lambda: _children(p.pid))
    else:
        assert _wait_for(p, lambda: any(r.stat().st_size for r in out_dir.rglob("metrics.jsonl")))
    os.killpg(p.pid, signal.SIGINT)
    _out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert "Traceback" not in err and "InvalidStateError" not in err, err
    assert "interrupted" in err
    assert not _children(p.pid)


def test_a_killed_worker_is_started_again_and_no_other_run_is_blamed(experiment, tmp_path):
    out_dir = tmp_path / "out"
    p = _start(experiment, out_dir, "--jobs", "2")
    killed = None
    deadline = time.time() + 240
    while killed is None and time.time() < deadline and p.poll() is None:
        rows = list(out_dir.rglob("metrics.jsonl"))
        workers = _children(p.pid)
        if rows and any(r.stat().st_size for r in rows) and workers:
            killed = workers[0]
            os.kill(killed, signal.SIGKILL)
        time.sleep(0.1)
    _out, err = p.communicate(timeout=600)
    assert killed is not None, err
    assert p.returncode == 0, err
    assert "Traceback" not in err and "BrokenProcessPool" not in err, err
    statuses = [json.loads(s.read_text())["status"] for s in sorted(out_dir.rglob("status.json"))]
    assert statuses == ["finished"] * 4, (statuses, err)


def _tracker(pid: int) -> int | None:
    """The multiprocessing resource tracker started by ``pid``, if it runs."""
    found = _children_with(pid, b"resource_tracker")
    return found[0] if found else None


def test_a_killed_resource_tracker_prints_no_traceback(experiment, tmp_path):
    """SIGKILL of the resource tracker multiprocessing starts for compare's queues: Python
    starts another, which is told to forget semaphores it never saw; compare finishes and
    nothing prints a traceback."""
    out_dir = tmp_path / "out"
    p = _start(experiment, out_dir, "--jobs", "2")
    assert _wait_for(p, lambda: _tracker(p.pid) and _children(p.pid))
    os.kill(_tracker(p.pid), signal.SIGKILL)
    _out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err
    assert "Traceback" not in err and "KeyError" not in err, err
    statuses = [json.loads(s.read_text())["status"] for s in sorted(out_dir.rglob("status.json"))]
    assert statuses == ["finished"] * 4, (statuses, err)


def test_a_ctrl_c_while_workers_start_waits_until_they_are_started():
    """Issue 32: SIGINT reaching another thread (a queue's feeder, SIGINT unblocked) made
    Python raise ``KeyboardInterrupt`` in the main thread whatever its mask, in the middle of
    starting a worker (it then died on "EOFError: Ran out of input"). The interrupt is held
    until the block ends, then raised."""
    from attnlab.experiments.running.parallel import _no_sigint

    assert threading.current_thread() is threading.main_thread()
    q = mp.get_context("spawn").Queue()
    q.put(1)  # its feeder thread starts now, with SIGINT unblocked
    body_finished = False
    with pytest.raises(KeyboardInterrupt), _no_sigint():
        os.kill(os.getpid(), signal.SIGINT)
        # until a thread with SIGINT unblocked (the feeder) has taken it: under load that thread
        # may wait for a core well past any fixed delay (a 0.5 s wait failed so, issue 32)
        deadline = time.monotonic() + 60
        while signal.SIGINT in signal.sigpending() and time.monotonic() < deadline:
            pass
        assert signal.SIGINT not in signal.sigpending(), "no thread took the SIGINT in 60 s"
        for _ in range(10_000):  # Python runs the recorded handler between these bytecodes
            pass
        body_finished = True
    assert body_finished
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    q.close()
    q.join_thread()


def _slow_manager_exit(pool) -> None:
    """Make ``pool``'s manager thread take a second to close its pipes, as under load."""
    thread = pool._executor_manager_thread
    join_internals = thread.join_executor_internals

    def slow() -> None:
        time.sleep(1.0)
        join_internals()

    thread.join_executor_internals = slow


def test_stopping_the_pool_waits_for_its_manager_thread():
    """Issue 32: Python 3.11's exit hook writes to the pool manager's wakeup pipe unlocked
    while that thread closes it ("Exception ignored ... OSError: [Errno 9] Bad file descriptor"
    at exit after Ctrl-C under load). ``_stop`` returns only when the thread has ended."""
    from attnlab.experiments.running.parallel import _stop

    pool = ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"))
    pool.submit(time.sleep, 30)
    thread = pool._executor_manager_thread
    _slow_manager_exit(pool)
    _stop(pool)
    assert not thread.is_alive()
    assert thread.thread_wakeup._closed
