"""Consent to run code that came with a model folder: ``--trust-remote-code``.

An exported folder may carry the source of the plugin parts its model was trained with
(``plugins/NAME.py``), and a run or probe directory's config may name a plugin file inside it.
Importing such a file runs it, so attnlab imports code stored in a folder it loads as a model
only with the user's explicit consent, as transformers does with ``trust_remote_code=True``:

- on the command line, ``attnlab eval --trust-remote-code`` / ``attnlab inspect
  --trust-remote-code``;
- in Python, ``from_pretrained(DIR, trust_remote_code=True)`` (the flag transformers already
  asks for, honoured by attnlab's own model class too) or ``with trusting_remote_code(): ...``.

Consent is held in a context variable for the duration of one load (it never outlives the block
that gave it and does not leak into other threads). Consent is not enough on its own: the files
are still checked against the SHA-256 the export recorded, and never read outside the folder
(:mod:`attnlab.hf.export_plugins`).

While a folder is loaded as a model (:func:`guarding`, around reading a run's or a probe's
config), the plugin loader asks :func:`check_code_path` before importing a file: one inside the
folder is refused without consent, naming it. Plugin files elsewhere (the user's own, recorded by
absolute path when they trained) load as before.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path

from attnlab.base.errors import UserError

#: the command-line flag that gives consent
FLAG = "--trust-remote-code"
#: the same consent in Python (transformers' own keyword)
KEYWORD = "trust_remote_code=True"

_TRUSTED: ContextVar[bool] = ContextVar("attnlab_trust_remote_code", default=False)
_GUARDED: ContextVar[tuple[Path, ...]] = ContextVar("attnlab_guarded_folders", default=())


class RemoteCodeError(UserError):
    """Code that came with a model folder, which attnlab will not import (no consent, a changed
    file, a path out of the folder); the message names the files and the fix."""


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


@contextlib.contextmanager
def guarding(folder: str | os.PathLike) -> Iterator[None]:
    """Inside this block, a plugin file inside ``folder`` (a model folder being loaded) is
    imported only with consent (:func:`check_code_path`)."""
    token = _GUARDED.set((*_GUARDED.get(), Path(os.path.abspath(folder)).resolve()))
    try:
        yield
    finally:
        _GUARDED.reset(token)


def check_code_path(path: str | os.PathLike) -> None:
    """Refuse (:class:`RemoteCodeError`) to import the file ``path`` when it lies inside a folder
    being loaded as a model (:func:`guarding`) and the user has not consented."""
    if remote_code_trusted() or not _GUARDED.get():
        return
    real = Path(os.path.abspath(path)).resolve()
    for folder in _GUARDED.get():
        if real.is_relative_to(folder):
            raise RemoteCodeError(
                f"{folder} names code inside it ({real.relative_to(folder)}), which loading it "
                f"would run; attnlab runs code that comes with a model folder only with your "
                f"consent: read it, then {how_to_consent()}. Or move the file out of the folder "
                "and pass --plugin NEWPATH"
            )
