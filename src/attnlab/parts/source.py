"""Where a registered part comes from: attnlab itself (``built-in``) or the plugin whose import
registered it, and the error for a part that cannot be registered or found.

The plugin loader (:mod:`attnlab.parts.plugins`) wraps each plugin's import in
:func:`registering_as`; the registry (:mod:`attnlab.parts.registry`) records the current source
with every part. Both import this module and neither imports the other at module level.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from attnlab.base.errors import UserError

BUILTIN = "built-in"

_source = threading.local()


class PartError(UserError):
    """A part that cannot be registered or found; the message names the part and the fix."""


@contextlib.contextmanager
def registering_as(source: str) -> Iterator[None]:
    """Parts registered inside this block are recorded as coming from ``source``."""
    old = getattr(_source, "name", None)
    _source.name = source
    try:
        yield
    finally:
        _source.name = old


def current_source(cls: type) -> str:
    """The source a part class registered now is recorded under."""
    name = getattr(_source, "name", None)
    if name:
        return name
    return BUILTIN if cls.__module__.startswith("attnlab.") else cls.__module__
