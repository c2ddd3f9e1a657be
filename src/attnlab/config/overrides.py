"""``--set dotted.key=value``: parsing an override, applying a list of them to a raw config, and
refusing two that set one option."""

from __future__ import annotations

import copy
import tomllib
from collections.abc import Iterable, Mapping
from typing import Any

from attnlab.config.carried import is_slot, set_explicitly, switch_kind
from attnlab.config.errors import ConfigError
from attnlab.config.legacy import current_name, is_old_position_key, legacy_position
from attnlab.config.merge import deep_merge


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` -> (["a","b","c"], value); the value is read as TOML, else as a string;
    ``null`` resets an optional field to None (``none`` stays a string: it is a valid choice of
    some keys, e.g. model.position.kind)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like dotted.key=value")
    key, _, text = item.partition("=")
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {item!r} has an empty key part")
    text = text.strip()
    if text == "null":
        return key.split("."), None
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        value = text
    except RecursionError:
        raise ConfigError(f"override {key!r}: the value is nested too deeply to read") from None
    return key.split("."), value


def apply_overrides(raw: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply ``dotted.key=value`` strings to a deep copy of a raw config dict.

    ``model.<slot>.kind=...`` overrides apply first; one that changes the part keeps the
    options the new kind also has (:func:`~attnlab.config.carried.switch_kind`), and the other
    overrides of that table then apply on top. Two overrides of one option (the same key with
    two values, or an old key name beside its new one) are refused, naming both."""
    out = copy.deepcopy(dict(raw))
    model = out.get("model")
    if isinstance(model, dict) and isinstance(model.get("position"), Mapping):
        model["position"] = legacy_position(model["position"])  # today's names, then --set
    items = list(overrides)
    parsed = [current_name(*parse_override(item)) for item in items]
    _refuse_repeats(items, parsed)
    kinds = [(p, v) for p, v in parsed if p[-1] == "kind" and is_slot(p[:-1])]
    for path, value in kinds + [(p, v) for p, v in parsed if (p, v) not in kinds]:
        parent, node = out, out
        for part in path[:-1]:
            nxt = node.get(part)
            if not isinstance(nxt, dict):
                nxt = {}
                node[part] = nxt
            parent, node = node, nxt
        key, table = path[-1], tuple(path[:-1])
        if is_slot(table) and key == "kind":
            if value != node.get("kind"):
                parent[path[-2]] = switch_kind(node, {"kind": value})
        elif is_slot(tuple(path)) and isinstance(value, Mapping):
            node[key] = deep_merge(node, {key: value}, table)[key]  # a whole table: as a file's
        else:
            node[key] = value
            if is_slot(table):
                set_explicitly(node, [key])
    return out


def _refuse_repeats(
    items: list[str], parsed: list[tuple[list[str], Any]], same_key: bool = False
) -> None:
    """Two overrides of one option (an old key name beside its new one; with ``same_key`` also
    one key with two values) are refused, naming both."""
    seen: dict[tuple[str, ...], tuple[str, Any]] = {}
    for item, (path, value) in zip(items, parsed):
        first = seen.setdefault(tuple(path), (item, value))
        named = [i.partition("=")[0].strip() for i in (first[0], item)]
        if first[0] == item or (named[0] == named[1] and not same_key):
            continue
        if named[0] == named[1] and type(first[1]) is type(value) and first[1] == value:
            continue
        why = "two values for one key"
        if named[0] != named[1]:
            old = [n for n in named if is_old_position_key(n)]
            why = f"{old[0] if old else named[0]} is the old name of {'.'.join(path)}"
        raise ConfigError(
            f"{first[0].strip()!r} and {item.strip()!r} both set {'.'.join(path)} "
            f"({why}); keep one of them"
        )


def check_distinct(overrides: Iterable[str]) -> None:
    """Refuse a list of ``key=value`` items a user wrote (``--set``, an experiment's ``set``)
    that sets one option twice: one key with two values, or an old key name beside its new one
    (the first would be lost without a word). :class:`ConfigError` names both."""
    items = [i for i in overrides if "=" in i]
    parsed = []
    for item in items:
        try:
            parsed.append(current_name(*parse_override(item)))
        except ConfigError:
            parsed.append(([f"\0{item}"], None))  # refused with its own message when applied
    _refuse_repeats(items, parsed, same_key=True)
