"""Exit codes of ``attnlab``: one place, so the CLI, its ``--help`` and the README agree.

Shell scripts and schedulers branch on these; a code's meaning never changes.
"""

from __future__ import annotations

#: the command did what was asked
OK = 0
#: part of the work failed, the rest is recorded (``compare``/``probe`` runs, ``bench`` targets,
#: a ``bench`` section that failed for a subject); ``check``: some property of a part failed
FAILED = 1
#: bad input: a config, flag, file, data or directory; the message names the cause and the fix
USER_ERROR = 2
#: numerically broken: the run diverged (NaN/inf loss or a loss spike), or a model's weights or
#: outputs are not finite; ``compare`` records a diverged run as a result instead
DIVERGED = 3
#: interrupted (Ctrl-C, SIGINT)
INTERRUPTED = 130

EPILOG = f"""\
exit codes:
  {OK}    success
  {FAILED}    some runs failed (compare, probe), a bench section failed for a subject, or
       benchmark targets were missed; the rest is saved; check: some property of a part failed
  {USER_ERROR}    bad input: config, flag, file, data or directory (the message says what to fix)
  {DIVERGED}    the run diverged (NaN/inf or loss spike; recorded in status.json), or a model's
       weights or outputs are not finite (eval, generate)
  {INTERRUPTED}  interrupted
"""
