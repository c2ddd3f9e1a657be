"""``attnlab compare --jobs N`` when its worker processes are killed or the user presses Ctrl-C
(issue 24): a killed worker's run is started again (it resumes from its checkpoint) and the
other runs are not blamed; SIGINT at any moment ends with "interrupted" and no traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import attnlab
from data_helpers import tiny_experiment

SRC = str(Path(attnlab.__file__).resolve().parents[1])
THREE = '[[variants]]\nname = "a"\n[[variants]]\nname = "b"\nset = ["train.lr=0.002"]\n'


def _start(exp: Path, out: Path, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
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
