"""The mask keys of ``[model.attention]`` before masks were parts (issue 34), and their reading
under ``[model.mask]``: one table, read by the config loader (recorded runs, TOML files, presets)
and by ``--set`` (``model.attention.window=3`` is ``model.mask.window=3``), each time with an
:class:`OldKeyWarning` naming the new spelling.

A recorded config held every old key whatever its mask (``window = 0`` beside ``mask =
"causal"``), so the options the mask's kind does not have are dropped, as are zeros a kind's
part would refuse (``window = 0``: the old "unset").
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from attnlab.config.errors import ConfigError

#: ``model.attention.mask`` values -> the kind of ``[model.mask]``
LEGACY_MASK_KINDS = {
    "causal": "causal",
    "bidirectional": "full",
    "prefix": "prefix",
    "sliding": "sliding",
    "local_global": "local_global",
    "bigbird": "bigbird",
}
#: old option keys of ``[model.attention]`` -> the kinds that have them under ``[model.mask]``
LEGACY_MASK_KEYS = {
    "window": ("sliding", "local_global", "bigbird"),
    "n_global": ("local_global", "bigbird"),
    "global_every": ("local_global", "bigbird"),
    "prefix_len": ("prefix",),
    "block_size": ("bigbird",),
    "random_blocks": ("bigbird",),
    "random_seed": ("bigbird",),
}
OLD_MASK_KEYS = ("mask", *LEGACY_MASK_KEYS)


class OldKeyWarning(UserWarning):
    """A config key of an earlier attnlab version was read under its new spelling."""


def legacy_mask(model: Any) -> Any:
    """A raw ``[model]`` table with its old ``attention`` mask keys moved to ``mask`` (with an
    :class:`OldKeyWarning`); unchanged when it has none."""
    if not isinstance(model, Mapping) or not isinstance(model.get("attention"), Mapping):
        return model
    attention = model["attention"]
    old = {k: attention[k] for k in OLD_MASK_KEYS if k in attention}
    if not old:
        return model
    table = dict(model.get("mask") or {}) if isinstance(model.get("mask"), Mapping) else {}
    if "mask" in old:
        table["kind"] = _kind(old["mask"])
    kind = table.get("kind")  # None: a family's settle or the default names it later
    for key, value in old.items():
        if key == "mask" or _unset(key, value):
            continue
        if kind is None or kind in LEGACY_MASK_KEYS[key]:
            table[key] = value
    out = {**model, "attention": {k: v for k, v in attention.items() if k not in old}}
    out["mask"] = table
    said = ", ".join(f"model.attention.{k}" for k in old)
    warnings.warn(
        f"{said}: old keys read as [model.mask] kind = {kind or 'causal'!r} with its options (write "
        "[model.mask] in the config; `attnlab parts mask` lists the kinds)",
        OldKeyWarning,
        stacklevel=2,
    )
    return out


def current_mask_name(path: list[str], value: Any) -> tuple[list[str], Any]:
    """An override of an old mask key under today's name (``model.attention.mask=sliding`` ->
    ``model.mask.kind=sliding``), with an :class:`OldKeyWarning`."""
    if len(path) != 3 or path[:2] != ["model", "attention"] or path[2] not in OLD_MASK_KEYS:
        return path, value
    new = ["model", "mask", "kind" if path[2] == "mask" else path[2]]
    if path[2] == "mask":
        value = _kind(value)
    warnings.warn(
        f"model.attention.{path[2]} is the old spelling of {'.'.join(new)}; reading it so",
        OldKeyWarning,
        stacklevel=3,
    )
    return new, value


def _kind(value: Any) -> Any:
    if isinstance(value, str) and value in LEGACY_MASK_KINDS:
        return LEGACY_MASK_KINDS[value]
    if isinstance(value, str):
        return value  # a new kind name under the old key: the registry judges it
    raise ConfigError(f"model.attention.mask = {value!r} is not a mask name; use [model.mask] kind")


def _unset(key: str, value: Any) -> bool:
    """The old default that meant "not used" (a window of 0)."""
    return key in ("window", "prefix_len", "random_blocks") and value == 0
