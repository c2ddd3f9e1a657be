"""Errors that are the user's to fix: the CLI prints their message, not a traceback."""

from __future__ import annotations


class UserError(Exception):
    """Bad input (config, file, data, checkpoint); the message names the cause and the fix."""


class InvalidRequestError(UserError, ValueError):
    """A call whose arguments cannot be served (e.g. a prompt longer than the model's positions)."""
