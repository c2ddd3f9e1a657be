"""A pydantic ``ValidationError`` as readable lines: an unknown key with the nearest valid
spelling (or what replaced an old key), a value with the allowed choices, an impossible
combination with its reason. The training config, the probe's and experiment files share it."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from attnlab.base.schema import PartOptions, slot_of
from attnlab.config.errors import cut_repr
from attnlab.config.legacy import RENAMED, renamed_under


def explain(
    err: ValidationError,
    root: type[BaseModel],
    title: str = "invalid config",
    raw: Mapping[str, Any] | None = None,
    renamed: Mapping[str, str] = RENAMED,
) -> str:
    """One readable line per problem: unknown keys with the nearest valid spelling, values with
    the allowed choices, impossible combinations with their reason. ``root`` is the schema the
    error came from, ``raw`` the dict that was validated (it says which part a slot table
    holds), ``renamed`` the old keys of that tree (:mod:`attnlab.config.legacy`)."""
    lines = []
    for e in err.errors():
        loc = tuple(str(p) if not isinstance(p, int) else p for p in e["loc"])
        dotted = ".".join(map(str, loc)) or "(root)"
        kind = e["type"]
        if kind == "extra_forbidden":
            lines.append(_unknown_key(root, loc, raw, renamed))
        elif kind == "same_option":
            lines.append(e["msg"])
        elif kind == "unknown_part":
            lines.append(f"'{dotted}.kind': {e['ctx']['problem']}")
        elif kind == "not_registered":
            lines.append(f"'{dotted}': {e['ctx']['problem']}")
        elif kind == "literal_error":
            expected = e.get("ctx", {}).get("expected", "")
            lines.append(
                f"'{dotted}' = {cut_repr(e['input'])} is not allowed; choose one of {expected}"
            )
        elif kind == "value_error":
            msg = str(e.get("ctx", {}).get("error", e["msg"]))
            lines.extend(f"impossible combination: {part}" for part in msg.split("\n"))
        else:
            lines.append(f"'{dotted}' = {cut_repr(e['input'])}: {e['msg']}")
    return f"{title}:\n  - " + "\n  - ".join(lines)


def _unknown_key(
    root: type[BaseModel],
    loc: tuple[Any, ...],
    raw: Mapping[str, Any] | None,
    renamed: Mapping[str, str],
) -> str:
    """The line of a key the schema does not have: the nearest valid spelling or what replaced
    an old key, the valid keys, and for a part's option the kinds that have it."""
    dotted = ".".join(map(str, loc))
    parent = ".".join(map(str, loc[:-1]))
    cls = schema_at(root, loc[:-1], raw)
    valid = list(cls.model_fields)
    olds = renamed_under(renamed, parent)
    near = difflib.get_close_matches(str(loc[-1]), [*valid, *olds], n=1, cutoff=0.4)
    hint = ""
    if near and near[0] in olds:
        hint = f" did you mean '{'.'.join(map(str, (*loc[:-1], near[0])))}'? it is now "
        hint += f"{olds[near[0]]}."
        if near[0] == loc[-1]:
            hint = f" it is now {olds[near[0]]}."
    elif near:
        hint = f" did you mean '{'.'.join(map(str, (*loc[:-1], near[0])))}'?"
    where = ""
    if issubclass(cls, PartOptions) and len(loc) >= 2:
        where = f" of {loc[-2]} part {raw_kind(raw, loc[:-1], cls)!r}"
        hint += _other_kinds_hint(loc)
    return f"unknown key '{dotted}'{where}.{hint} Valid keys here: {', '.join(valid)}"


def _raw_at(raw: Mapping[str, Any] | None, loc: tuple[Any, ...]) -> Any:
    node: Any = raw
    for part in loc:
        if isinstance(node, Mapping):
            node = node.get(part)
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            return None
    return node


def schema_at(
    root: type[BaseModel], loc: tuple[Any, ...], raw: Mapping[str, Any] | None = None
) -> type[BaseModel]:
    """The model class of the table at ``loc`` in the ``root`` schema; list indices are stepped
    over, ``list[Model]`` / ``Model | None`` fields are followed into the model, and a slot table
    is the options class of the part its ``kind`` (read from ``raw``) names."""
    cls = root
    for i, part in enumerate(loc):
        if isinstance(part, int):
            continue
        field = cls.model_fields.get(str(part))
        if field is None:
            break
        slot = slot_of(field)
        if slot is not None:
            from attnlab.parts import registry

            table = _raw_at(raw, loc[: i + 1])
            kind = table.get("kind") if isinstance(table, Mapping) else None
            kind = kind if isinstance(kind, str) else registry.default_kind(slot)
            if not registry.has(slot, kind):
                break
            cls = registry.get(slot, kind).options
            continue
        ann = field.annotation
        args = get_args(ann) or (ann,)
        models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        if not models:
            break
        cls = models[0]
    return cls


def fields_at(
    root: type[BaseModel], loc: tuple[Any, ...], raw: Mapping[str, Any] | None = None
) -> list[str]:
    """Valid field names of the table at ``loc`` (see :func:`schema_at`)."""
    return list(schema_at(root, loc, raw).model_fields)


def raw_kind(raw: Mapping[str, Any] | None, loc: tuple[Any, ...], cls: Any = None) -> str:
    """The part kind the raw table at ``loc`` names (its slot's default when it names none)."""
    table = _raw_at(raw, loc)
    kind = table.get("kind") if isinstance(table, Mapping) else None
    if kind is None and len(loc) >= 1:
        from attnlab.parts import registry
        from attnlab.parts.slots import SLOTS

        if str(loc[-1]) in SLOTS:
            return registry.default_kind(str(loc[-1]))
    return str(kind) if kind is not None else "default"


def _other_kinds_hint(loc: tuple[Any, ...]) -> str:
    """For an option the chosen part lacks: the kinds of that slot that have it."""
    from attnlab.parts import registry
    from attnlab.parts.slots import SLOTS

    slot, key = str(loc[-2]), str(loc[-1])
    if slot not in SLOTS:
        return ""
    have = [s.kind for s in registry.specs(slot) if key in s.options.model_fields]
    if not have:
        return ""
    kinds = " or ".join(repr(k) for k in have)
    return f" '{key}' is an option of {slot} kind {kinds}: set {'.'.join(map(str, loc[:-1]))}.kind."
