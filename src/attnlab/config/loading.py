"""Where a config comes from: a bundled preset (``attnlab/presets/NAME.toml``), a TOML file, or
both (a file may say ``extends = "NAME"``), then ``--plugin`` and ``--set`` on top."""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any

from attnlab.base.pathkind import not_a_file
from attnlab.config.errors import ConfigError
from attnlab.config.merge import deep_merge
from attnlab.config.overrides import apply_overrides
from attnlab.config.plugins import resolve_plugin_paths, with_plugins
from attnlab.config.schema import Config, validate


def preset_names() -> list[str]:
    """Names of the bundled presets."""
    root = resources.files("attnlab") / "presets"
    return sorted(p.name[: -len(".toml")] for p in root.iterdir() if p.name.endswith(".toml"))


def _read_toml(text: str, where: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{where}: not valid TOML ({e}); fix the syntax at that line") from None
    except RecursionError:
        raise ConfigError(f"{where}: TOML nested too deeply to read; flatten it") from None


def read_toml_file(path: str | Path, what: str = "config file") -> dict[str, Any]:
    """A TOML file as a dict; a missing file, non-UTF-8 bytes or bad syntax is a ConfigError."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{what} {str(path)!r} {not_a_file(p)}; give the path of a TOML file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{what} {str(path)!r} is not UTF-8 text; save it as UTF-8") from None
    return _read_toml(text, str(path))


def _preset_dict(name: str, _seen: tuple[str, ...] = ()) -> dict[str, Any]:
    if name in _seen:
        raise ConfigError(f"preset {name!r} extends itself through {' -> '.join(_seen)}")
    path = resources.files("attnlab") / "presets" / f"{name}.toml"
    if not path.is_file():
        near = difflib.get_close_matches(name, preset_names(), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(map(repr, near))}?" if near else ""
        raise ConfigError(
            f"unknown preset {name!r}{hint} Presets: {', '.join(preset_names())}. "
            "A file path must exist and end in .toml"
        )
    raw = _read_toml(path.read_text(encoding="utf-8"), f"preset {name}")
    return _resolve_extends(raw, (*_seen, name))


def _resolve_extends(raw: dict[str, Any], seen: tuple[str, ...] = ()) -> dict[str, Any]:
    parent = raw.pop("extends", None)
    if parent is None:
        return raw
    if not isinstance(parent, str):
        raise ConfigError(f"'extends' must be a preset name string, got {parent!r}")
    return deep_merge(_preset_dict(parent, seen), raw)


def source_dict(name_or_path: str | Path) -> dict[str, Any]:
    """The raw (unvalidated) dict of a preset name or a TOML file, with ``extends`` resolved."""
    s = str(name_or_path)
    if s.endswith(".toml") or Path(s).exists():
        if Path(s).is_dir():
            raise ConfigError(f"config {s!r} is a directory; give a TOML file or a preset name")
        if not Path(s).is_file():
            raise ConfigError(f"config file {s!r} {not_a_file(s)}; give a preset name or a path")
        return _resolve_extends(resolve_plugin_paths(read_toml_file(s), Path(s).parent))
    return _preset_dict(s)


def load_config(
    name_or_path: str | Path | None = None,
    overrides: Iterable[str] = (),
    plugins: Iterable[str] = (),
) -> Config:
    """Load a preset or TOML file (or the defaults when None), add ``plugins`` (``--plugin``),
    apply overrides, validate."""
    raw = source_dict(name_or_path) if name_or_path is not None else {}
    return validate(apply_overrides(with_plugins(raw, plugins), overrides))
