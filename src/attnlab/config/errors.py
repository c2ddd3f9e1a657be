"""The config's error and the one helper its messages use to echo a value."""

from __future__ import annotations

from typing import Any

from attnlab.base.errors import UserError


class ConfigError(UserError, ValueError):
    """A configuration that cannot be used; the message names the key, the cause and the fix."""


def cut_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters with its full length named (a 100 MB string
    in a TOML file is not echoed back)."""
    text = (
        repr(value)
        if not isinstance(value, str | bytes) or len(value) <= 4 * limit
        else (repr(value[:limit]))
    )
    size = len(value) if isinstance(value, str | bytes) else len(text)
    if size <= limit and len(text) <= limit + 2:
        return text
    return f"{text[: limit + 1]}... ({size:,} characters)"
