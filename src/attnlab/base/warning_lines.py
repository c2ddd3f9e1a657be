"""Python warnings on the command line: one ``attnlab CMD: warning: MESSAGE`` line, like errors.

:func:`cli_warnings` wraps a command (``attnlab.cli.main`` runs every command inside it);
:func:`install` does the same for a whole process (``compare --jobs`` workers). The rule:

- a warning of attnlab's own (its category is defined in attnlab, e.g. ``RunFileWarning``,
  ``CheckpointWarning``, ``PluginWarning``, ``AdapterWarning``, or it is raised from attnlab's
  code) prints as ``attnlab CMD: warning: MESSAGE``;
- a warning of another package (torch, transformers, a plugin file) prints the same way with
  the package named: ``attnlab CMD: warning: (torch) MESSAGE``, its message on one line;
- ``DeprecationWarning``, ``PendingDeprecationWarning`` and ``FutureWarning`` of other packages
  are dropped: they tell attnlab's developers about an API attnlab calls, and a user can do
  nothing about them;
- a user who configures warnings (``python -W ...``, ``PYTHONWARNINGS``) sees everything their
  filters let through, nothing dropped (``-W error`` still raises).

Never a source path or a source line.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import attnlab

_ROOT = Path(attnlab.__file__).resolve().parent
_DEVELOPER = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)


def _is_attnlab_name(module: str) -> bool:
    return module == "attnlab" or module.startswith("attnlab.")


def _from_attnlab(filename: str) -> bool:
    try:
        return Path(filename).resolve().is_relative_to(_ROOT)
    except (OSError, ValueError):
        return False


def origin(filename: str) -> str:
    """The package (or plugin file) a warning was raised from: the top-level name of the module
    whose file it is, else the file's name."""
    for name, module in list(sys.modules.items()):
        if getattr(module, "__file__", None) == filename and not name.startswith("attnlab_"):
            return name.split(".", 1)[0]
    return Path(filename).name or "python"


def line(
    command: str, message: Warning | str, category: type[Warning], filename: str
) -> str | None:
    """The line to print for one warning, or None when the rule drops it."""
    own = _is_attnlab_name(getattr(category, "__module__", "")) or _from_attnlab(filename)
    if own:
        return f"attnlab {command}: warning: {message}"
    if issubclass(category, _DEVELOPER) and not sys.warnoptions:
        return None
    text = " ".join(str(message).split())
    return f"attnlab {command}: warning: ({origin(filename)}) {text}"


@contextlib.contextmanager
def cli_warnings(command: str) -> Iterator[None]:
    """Print the warnings raised inside the block by :func:`line`'s rule (restored after)."""
    with warnings.catch_warnings():
        warnings.showwarning = _printer(command)
        yield


def install(command: str) -> None:
    """Print every later warning of this process by :func:`line`'s rule (a worker process)."""
    warnings.showwarning = _printer(command)


def _printer(command: str):
    def show(message, category, filename, lineno, file=None, source=None) -> None:
        text = line(command, message, category, filename)
        if text is not None:
            print(text, file=sys.stderr, flush=True)

    return show
