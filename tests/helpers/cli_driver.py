"""Run many ``attnlab`` command lines fast: one process imports attnlab (and torch) once, then
forks a fresh child per command line, which runs ``attnlab.cli.main`` exactly as the console
script does and exits with its code.

An exception escaping ``main`` is printed the way the interpreter prints it (``Traceback ...``)
and exits 1, so a child behaves like ``attnlab ARGS`` started from a shell. Protocol: one JSON
object per stdin line, ``{"argv": [...], "cwd": DIR, "stdout": FILE, "stderr": FILE}``; one
``{"rc": N}`` per stdout line. Arguments that are not UTF-8 travel surrogate-escaped, as Python
decodes ``sys.argv``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback

import torch  # noqa: F401  (imported once here, not in every child)

import attnlab.cli
import attnlab.commands.bench
import attnlab.eval.evaluate
import attnlab.experiments
import attnlab.model
import attnlab.runs.preflight
import attnlab.train
from attnlab.config import load_config
from attnlab.model.params import count

count(load_config("tiny").model)  # the first meta-device build imports torch._dynamo: once, here
attnlab.cli.build_parser()  # imports every command module and what their flags list
WARM = (
    attnlab.commands.bench,
    attnlab.eval.evaluate,
    attnlab.experiments,
    attnlab.model,
    attnlab.runs.preflight,
    attnlab.train,
)

CHILD_TIMEOUT_S = 300


def _child(case: dict) -> None:
    os.chdir(case["cwd"])
    for fd, name in ((1, "stdout"), (2, "stderr")):
        out = os.open(case[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, fd)
        os.close(out)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    signal.alarm(CHILD_TIMEOUT_S)
    sys.argv = ["attnlab", *case["argv"]]
    try:
        code = attnlab.cli.main(case["argv"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(code or 0) & 0xFF)


def main() -> None:
    for line in sys.stdin:
        case = json.loads(line)
        pid = os.fork()
        if pid == 0:
            try:
                _child(case)
            finally:
                os._exit(70)
        _, status = os.waitpid(pid, 0)
        rc = os.waitstatus_to_exitcode(status)
        print(json.dumps({"rc": rc}), flush=True)


if __name__ == "__main__":
    main()
