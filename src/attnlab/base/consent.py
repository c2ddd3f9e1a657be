"""Consent to run code that came with a model folder: ``--trust-remote-code``.

An exported folder may carry the source of the plugin parts its model was trained with
(``plugins/NAME.py``). Importing such a file runs it, so attnlab imports code stored in a folder
only with the user's explicit consent, as transformers does with ``trust_remote_code=True``:

- on the command line, ``attnlab eval --trust-remote-code`` / ``attnlab inspect
  --trust-remote-code``;
- in Python, ``from_pretrained(DIR, trust_remote_code=True)`` (the flag transformers already
  asks for, honoured by attnlab's own model class too) or ``with trusting_remote_code(): ...``.

Consent is held in a context variable for the duration of one load (it never outlives the block
that gave it and does not leak into other threads). Consent is not enough on its own: the files
are still checked against the SHA-256 the export recorded, and never read outside the folder
(:mod:`attnlab.hf.export_plugins`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

#: the command-line flag that gives consent
FLAG = "--trust-remote-code"
#: the same consent in Python (transformers' own keyword)
KEYWORD = "trust_remote_code=True"

_TRUSTED: ContextVar[bool] = ContextVar("attnlab_trust_remote_code", default=False)


@contextlib.contextmanager
def trusting_remote_code(trusted: bool = True) -> Iterator[None]:
    """Inside this block, loading a model folder may import the code it carries (``trusted``);
    ``trusted=False`` leaves the consent as it was (an inner load never withdraws an outer one)."""
    token = _TRUSTED.set(_TRUSTED.get() or bool(trusted))
    try:
        yield
    finally:
        _TRUSTED.reset(token)


def remote_code_trusted() -> bool:
    """Whether the current load runs with the user's consent to import a folder's code."""
    return _TRUSTED.get()


def how_to_consent() -> str:
    """The words of a refusal that say how to give consent."""
    return f"pass {FLAG} (in Python: from_pretrained(..., {KEYWORD}))"
