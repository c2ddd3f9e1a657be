"""A write that the system refuses (a file-size limit, standing in for a full disk) reaches the
user as one message naming the file and the fix, never a traceback, and every checkpoint written
before it survives byte for byte."""

from __future__ import annotations

import errno
import hashlib
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import attnlab
from attnlab.base.failures import describe, os_error_of
from attnlab.config import load_config
from attnlab.runs.checkpoint import load_latest
from attnlab.train import train

SRC = str(Path(attnlab.__file__).resolve().parents[1])
LIMIT = 64 * 1024  # larger than config/status/metrics files, smaller than the tiny weights


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


def test_a_checkpoint_write_over_the_file_size_limit(hostile_lab, tmp_path):
    run = tmp_path / "run"
    data = tmp_path / "prepared"
    shutil.copytree(hostile_lab.data, data)  # the lab stays read-only
    cfg_path = tmp_path / "cfg.toml"
    cfg_path.write_text(
        hostile_lab.cfg.read_text().replace(str(hostile_lab.data), str(data)), encoding="utf-8"
    )
    stopped = train(load_config(cfg_path), run, _stop_after=3)  # "killed" after step 3
    assert stopped.steps == 3
    ckpt = run / "checkpoints" / "step_0000003"
    assert (ckpt / "model.safetensors").stat().st_size > LIMIT  # the next one cannot be written
    before = _digest(ckpt)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run(
        [sys.executable, "-m", "attnlab", "train", str(cfg_path), "--out", str(run), "--quiet"],
        capture_output=True,
        text=True,
        env=env,
        preexec_fn=_limit_file_size,
        timeout=300,
    )
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr + p.stdout, p.stderr
    assert "File too large" in p.stderr and "file-size limit" in p.stderr, p.stderr
    assert _digest(ckpt) == before
    latest = load_latest(run)
    assert latest is not None and latest.step == 3  # a rerun resumes from the intact one


def test_wrapped_os_errors_are_found():
    class SafetensorError(Exception):
        pass

    found = os_error_of(SafetensorError("I/O error: File too large (os error 27)"))
    assert found is not None and found.errno == errno.EFBIG
    old = (
        'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space" })'
    )
    found = os_error_of(SafetensorError(old))  # safetensors 0.4's wording
    assert found is not None and found.errno == errno.ENOSPC
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("checkpoint failed") from inner
    except RuntimeError as outer:
        assert os_error_of(outer).errno == errno.ENOSPC
    assert os_error_of(ValueError("a plain bug")) is None


@pytest.mark.fast
def test_system_failures_are_described_with_a_fix():
    for err, words in [
        (OSError(errno.ENOSPC, "No space left on device", "/x/ckpt"), ("disk is full", "/x/ckpt")),
        (OSError(errno.EFBIG, "File too large", "/x/f"), ("file-size limit", "/x/f")),
        (OSError(errno.EROFS, "Read-only file system", "/ro"), ("read-only", "/ro")),
        (PermissionError(errno.EACCES, "Permission denied", "/p"), ("permission", "/p")),
        (RecursionError(), ("nested too deeply",)),
        (MemoryError(), ("out of memory", "batch size")),
        (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), ("UTF-8",)),
    ]:
        text = describe(err)
        assert all(w.lower() in text.lower() for w in words), (err, text)
