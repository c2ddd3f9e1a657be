"""The one place that knows the keys of earlier attnlab versions and what replaced them.

Two kinds of old key: those translated when a config loads (the ``[model.position]`` options from
before positions were a slot: a recorded run keeps loading with the same numbers), and those
only named in the unknown-key message (:data:`RENAMED`), where the new spelling is a different
structure the user should write (``model.pre_projection`` is now a part in a slot).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from attnlab.config.carried import set_explicitly
from attnlab.config.errors import ConfigError, cut_repr

#: option keys of ``[model.position]`` before positions were a slot -> (kind, the new key); a
#: recorded config held all of them whatever its kind, so the other kinds' ones are dropped
LEGACY_POSITION_KEYS = {
    "rope_fraction": ("rope", "fraction"),
    "rope_base": ("rope", "base"),
    "t5_buckets": ("t5", "buckets"),
    "t5_max_distance": ("t5", "max_distance"),
}

#: keys of earlier attnlab versions -> what replaced them (named in the unknown-key message),
#: per config tree: the training config's, and the probe's (its top-level keys)
RENAMED = {
    "model.pre_projection": "[model.feature_map] kind = 'pre_projection'",
    "model.content_skip": "[model.side_branch] kind = 'content_skip'",
    "model.identity_head": "[model.readout] kind = 'identity_head'",
    "model.virtual_heads": "[model.score] kind = 'virtual_heads'",
    "model.moe_values": "[model.value] kind = 'moe' (and model.loops for the looped layer)",
    "model.query.fused": "model.attention.fuse_qkv",
    "model.query.anchored_mean": "model.query.mean (with kind = 'anchored')",
    "model.mixer.nonlinear": "[model.mixer] kind = 'nonlinear'",
}
PROBE_RENAMED = {
    "pre_projection": "[probe.feature_map] kind = 'pre_projection'",
    "content_skip": "[probe.side_branch] kind = 'content_skip'",
    "anchored_query": "[probe.query] kind = 'anchored' (eps follows the part: 1e-5)",
}

#: the probe's part tables of the version before its slot tables: ``[parts.NAME]`` (NAME a part's
#: kind or probe name) is read as ``[probe.<its slot>] kind = "<its kind>"``, with a note
OLD_PROBE_PARTS = "parts"


def renamed_under(table: Mapping[str, str], parent: str) -> dict[str, str]:
    """The old keys of ``table`` directly under the dotted ``parent`` ("" for the top level):
    old key -> what replaced it."""
    out = {}
    for old, new in table.items():
        where, _, key = old.rpartition(".")
        if where == parent:
            out[key] = new
    return out


def legacy_position(table: Any, kind: Any = None) -> Any:
    """An old ``[model.position]`` table in the slot's form (new key names, no stray keys);
    ``kind`` is the position kind when the table names none (a layer merged over another).
    An old name beside its new one is refused, naming both: one of them would be lost."""
    if not isinstance(table, Mapping) or not any(k in table for k in LEGACY_POSITION_KEYS):
        return table
    kind = table.get("kind", kind or "learned")
    both = [
        (old, new) for old, (_, new) in LEGACY_POSITION_KEYS.items() if {old, new} <= set(table)
    ]
    if both:
        old, new = both[0]
        raise ConfigError(
            f"model.position.{old} = {cut_repr(table[old])} and model.position.{new} = "
            f"{cut_repr(table[new])} set the same option ({old} is the old name of {new}); "
            f"keep only model.position.{new}"
        )
    out = {k: v for k, v in table.items() if k not in LEGACY_POSITION_KEYS}
    for old, (owner, new) in LEGACY_POSITION_KEYS.items():
        if old in table and owner == kind:
            out[new] = table[old]
            set_explicitly(out, [new])
    return out


def current_name(path: list[str], value: Any) -> tuple[list[str], Any]:
    """An override of an old ``model.position`` key under today's name (``rope_base`` ->
    ``base``), so it replaces a preset's value instead of losing to it."""
    if len(path) == 3 and path[:2] == ["model", "position"] and path[2] in LEGACY_POSITION_KEYS:
        return [*path[:2], LEGACY_POSITION_KEYS[path[2]][1]], value
    return path, value


def is_old_position_key(dotted: str) -> bool:
    """``dotted`` (``model.position.rope_base``) names an old position option."""
    return dotted.rsplit(".", 1)[-1] in LEGACY_POSITION_KEYS


def moved_probe_parts(
    raw: Mapping[str, Any],
    locate: Callable[[str], tuple[str, str]],
    used: Mapping[str, list[str]],
) -> tuple[dict[str, Any], list[str]]:
    """A probe config's old ``[parts.NAME]`` tables as ``[probe.<slot>]`` tables, and one note
    per table naming its new spelling. ``locate`` gives a part name's (slot, kind) (raising
    :class:`ConfigError` for a name no injectable part has); ``used`` the kinds the method
    injects (or counts) per slot. A slot holds one table: where old tables of several kinds
    share a slot, the method's is kept (the others configured parts it does not inject)."""
    parts = raw.get(OLD_PROBE_PARTS)
    if parts is None:
        return dict(raw), []
    if not isinstance(parts, Mapping):
        raise ConfigError(
            f"parts = {cut_repr(parts)} is not a table; [parts.NAME] is the old spelling of "
            "[probe.<slot>] kind = 'NAME' (e.g. [probe.feature_map] kind = 'pre_projection')"
        )
    by_slot: dict[str, dict[str, tuple[str, Any]]] = {}
    for key, table in parts.items():
        slot, kind = locate(str(key))
        if kind in by_slot.setdefault(slot, {}):
            raise ConfigError(
                f"parts.{by_slot[slot][kind][0]} and parts.{key} are the same part ('{kind}'); "
                f"keep one table, [probe.{slot}] kind = '{kind}'"
            )
        if not isinstance(table, Mapping):
            raise ConfigError(f"parts.{key} = {cut_repr(table)} must be a table of its options")
        by_slot[slot][kind] = (str(key), table)
    probe = raw.get("probe")
    probe = dict(probe) if isinstance(probe, Mapping) else {}
    notes = []
    for slot, tables in by_slot.items():
        wanted = used.get(slot) or []
        kinds = [k for k in wanted if k in tables] if wanted else list(tables)
        if not kinds or (not wanted and len(kinds) > 1):
            continue  # the options of parts the method does not inject: nothing reads them
        kind = kinds[0]  # the method's own part before its @target's
        key, table = tables[kind]
        if slot in probe:
            raise ConfigError(
                f"parts.{key} and probe.{slot} both set the options of the {slot} part "
                f"(parts.{key} is the old spelling); keep only [probe.{slot}]"
            )
        probe[slot] = {**table, "kind": kind}
        notes.append(
            f"[parts.{key}] is the old spelling of [probe.{slot}] kind = '{kind}'; it was read "
            "as that (write it so)"
        )
    out = {k: v for k, v in raw.items() if k != OLD_PROBE_PARTS}
    out["probe"] = probe
    return out, notes
