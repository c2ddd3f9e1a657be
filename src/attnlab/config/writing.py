"""A config written back out as TOML (what ``config.toml`` in a run directory holds)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attnlab.config.schema import Config


def dump_toml(cfg: Config) -> str:
    """Serialise a config to TOML (None values are left out; they are the defaults)."""
    return to_toml(cfg.to_dict())


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)  # JSON's escapes are valid TOML basic strings
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def to_toml(d: Mapping[str, Any], prefix: str = "") -> str:
    """A nested dict as TOML: its scalars first, then one table per nested dict (None values
    are left out)."""
    scalars = [
        f"{k} = {_toml_value(v)}" for k, v in d.items() if not isinstance(v, dict) and v is not None
    ]
    out = []
    if scalars:
        if prefix:
            out.append(f"[{prefix}]")
        out.extend(scalars)
        out.append("")
    for k, v in d.items():
        if isinstance(v, dict):
            out.append(to_toml(v, f"{prefix}.{k}" if prefix else k))
    return "\n".join(out)
