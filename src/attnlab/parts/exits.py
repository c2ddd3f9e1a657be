"""Plugin code that tries to end the process: ``sys.exit()`` (or any ``BaseException`` that is
not a ``KeyboardInterrupt``) raised while attnlab runs a part's or a plugin's code.

Left alone it would end ``attnlab check`` or ``attnlab train`` with exit 0 having done nothing.
attnlab turns it into a failure that names the file and line that exited: a
:class:`PluginExitError` (a ``UserError``, exit 2) where a command runs plugin code (the plugin
loader, the training loop, the CLI's last line of defence), a failed property in the
conformance check. Ctrl-C (``KeyboardInterrupt``) stays an interrupt.
"""

from __future__ import annotations

import traceback

from attnlab.base.errors import UserError
from attnlab.parts.identity import is_local


class PluginExitError(UserError):
    """Plugin code raised ``SystemExit`` (``sys.exit()``) or another ``BaseException``."""


def is_exit(exc: BaseException) -> bool:
    """A ``BaseException`` that is neither an ``Exception`` nor a Ctrl-C: ``SystemExit``,
    ``GeneratorExit`` or a class of the plugin's own."""
    return not isinstance(exc, (Exception, KeyboardInterrupt))


def where(exc: BaseException) -> tuple[str, bool]:
    """(``FILE:LINE (code)``, whether it is the researcher's own code) of the innermost frame
    outside the standard library, site-packages and attnlab, else of the frame that raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "an unknown place", False
    own = [f for f in frames if is_local(f.filename)]
    f = (own or frames)[-1]
    code = (f.line or "").strip()
    return f"{f.filename}:{f.lineno}" + (f" ({code})" if code else ""), bool(own)


def what_exited(exc: BaseException) -> str:
    """``sys.exit(0)`` for a SystemExit, else the exception's class."""
    if isinstance(exc, SystemExit):
        return f"sys.exit({exc.code!r})"
    return f"{type(exc).__name__} (a BaseException that is not an Exception)"


def exit_message(exc: BaseException, during: str) -> str:
    """One sentence: what exited, where, during what, and the fix."""
    place, own = where(exc)
    return (
        f"{'plugin code' if own else 'code'} raised {what_exited(exc)} at {place} while "
        f"{during}; attnlab treats it as a failure, not as the end of the command: a part or "
        "plugin must raise an exception (e.g. ValueError) instead of ending the process"
    )


def as_error(exc: BaseException, during: str) -> PluginExitError | None:
    """The :class:`PluginExitError` that stands for ``exc``, or None when ``exc`` is an
    ordinary exception or a Ctrl-C (left as it is)."""
    return PluginExitError(exit_message(exc, during)) if is_exit(exc) else None
