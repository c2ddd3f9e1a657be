"""The config's hooks into plugin loading: a config's ``plugins`` list, resolved and loaded
before the rest of it is validated (in every process that validates it)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from attnlab.config.errors import ConfigError


def load_config_plugins(raw: dict[str, Any], base_dir: str | Path | None = None) -> dict[str, Any]:
    """Load the plugins ``raw`` names (relative paths from ``base_dir``) and return ``raw`` with
    them resolved; every config is validated after its plugins, in every process."""
    specs = raw.get("plugins")
    if specs is None:
        return raw
    if not isinstance(specs, list) or not all(isinstance(p, str) for p in specs):
        raise ConfigError(
            f"'plugins' must be a list of module names or .py file paths, got {specs!r}"
        )
    from attnlab.parts.plugins import load_plugins

    out = dict(raw)
    out["plugins"] = list(dict.fromkeys(load_plugins(specs, base_dir)))
    return out


def with_plugins(raw: dict[str, Any], plugins: Iterable[str] = ()) -> dict[str, Any]:
    """``raw`` with ``plugins`` (e.g. from ``--plugin``, relative to the working directory)
    added to its own list."""
    plugins = list(plugins)
    if not plugins:
        return raw
    from attnlab.parts.plugins import resolve_spec

    have = raw.get("plugins") or []
    return {**raw, "plugins": [*have, *(resolve_spec(p) for p in plugins)]}


def resolve_plugin_paths(raw: dict[str, Any], base_dir: str | Path) -> dict[str, Any]:
    """A file's ``plugins`` with relative paths read from the file's directory."""
    specs = raw.get("plugins")
    if not isinstance(specs, list):
        return raw
    from attnlab.parts.plugins import resolve_spec

    return {
        **raw,
        "plugins": [resolve_spec(p, base_dir) if isinstance(p, str) else p for p in specs],
    }
