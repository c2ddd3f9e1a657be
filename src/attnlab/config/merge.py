"""Merging raw config tables: a file over its ``extends`` preset, an experiment's variant over
its base. Tables merge, values replace; a slot table whose ``kind`` changes keeps what the new
kind also has (:mod:`attnlab.config.carried`). And the one flattening of a table to dotted keys."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attnlab.config.carried import is_slot, own_keys, set_explicitly, switch_kind
from attnlab.config.legacy import legacy_position


def deep_merge(
    base: Mapping[str, Any], over: Mapping[str, Any], _path: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Recursively merge ``over`` into a copy of ``base`` (tables merge, values replace). A slot
    table (``model.<slot>``) whose ``kind`` changes keeps the options the new kind also has
    (:func:`~attnlab.config.carried.switch_kind`): a preset's ``norm.bias = false`` stays false
    on another norm."""
    out = dict(base)
    for k, v in over.items():
        old = out.get(k)
        here = (*_path, k)
        if here == ("model", "position") and isinstance(v, Mapping):
            kind = old.get("kind") if isinstance(old, Mapping) else None
            v, old = legacy_position(v, kind), legacy_position(old)
        if isinstance(v, Mapping) and isinstance(old, Mapping):
            if is_slot(here) and "kind" in v and v["kind"] != old.get("kind"):
                out[k] = switch_kind(old, v)
            else:
                out[k] = deep_merge(old, v, here)
                if is_slot(here):
                    set_explicitly(out[k], own_keys(v))
        else:
            out[k] = v
    return out


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested table as ``{"dotted.key": value}`` of its leaves (``{"a": {"b": 1}}`` ->
    ``{"a.b": 1}``): how a config's differences and a sweep's grid are named."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out
