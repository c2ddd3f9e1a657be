"""Errors that are the user's to fix: the CLI prints their message, not a traceback."""

from __future__ import annotations


class UserError(Exception):
    """Bad input (config, file, data, checkpoint); the message names the cause and the fix.

    The CLI prints the message and exits with ``exit_code`` (see :mod:`attnlab.base.exitcodes`)."""

    exit_code = 2


class NonFiniteError(UserError):
    """A model whose weights or outputs are NaN/inf (e.g. a diverged checkpoint): exit code 3."""

    exit_code = 3


class InvalidRequestError(UserError, ValueError):
    """A call whose arguments cannot be served (e.g. a prompt longer than the model's positions)."""
