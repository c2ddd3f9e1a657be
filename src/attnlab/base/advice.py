"""Advice that names the running command's own flags: how to start a run over.

The run engine (checkpoints, the loop, run directories) is shared by ``train``, ``probe`` and
``compare``, and its checkpoints are read by ``eval``, ``generate``, ``export``, ``inspect``:
"rerun with --restart" is true in the first two only (``compare`` has no ``--restart``, and a
reading command restarts nothing). The engine says :func:`restart`, which is what the running
command set with :func:`restart_as` (the default names ``attnlab train`` in full, which holds
everywhere a run can be retrained). A context variable: a ``compare --jobs`` worker sets it in
its initializer, like its warning lines.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

RETRAIN = "retrain it from step 0 with `attnlab train CONFIG --out RUN_DIR --restart`"
RERUN = "rerun with --restart to start over from step 0"
COMPARE = "delete that run's directory and rerun `attnlab compare` to train it from step 0"

_RESTART: ContextVar[str] = ContextVar("attnlab_restart_advice", default=RETRAIN)


def restart() -> str:
    """How the user of the running command starts a run over (a clause, no full stop)."""
    return _RESTART.get()


def set_restart(text: str) -> None:
    """Set :func:`restart`'s answer for the rest of this context (a worker process)."""
    _RESTART.set(text)


@contextlib.contextmanager
def restart_as(text: str) -> Iterator[None]:
    """:func:`restart` answers ``text`` inside the block."""
    token = _RESTART.set(text)
    try:
        yield
    finally:
        _RESTART.reset(token)
