"""A slot table whose ``kind`` changes: the options it carries over, and settling them.

A preset sets a norm with ``bias = false`` and a file or ``--set`` switches ``model.norm.kind``
to another norm: the new table keeps the options the new kind also has (``bias`` stays false)
and drops, with a note naming them, those it lacks. While raw tables are merged, a table
records what it carried over (:data:`CARRIED`); validation settles the record
(:func:`settle_carried`) and it is never stored.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from typing import Any

#: the slot tables of a model config, in block order (see ``attnlab.parts.slots``)
SLOT_FIELDS = (
    "feature_map",
    "query",
    "key",
    "value",
    "score",
    "readout",
    "mixer",
    "side_branch",
    "ffn",
    "position",
    "norm",
    "cross_attention",
)

#: a raw slot table's record of the options it carried over from the table of another kind:
#: {option: the kind it was set for (None: the slot's default)}. Written by :func:`switch_kind`,
#: settled and removed when the config is validated (:func:`settle_carried`); never stored.
CARRIED = "__carried_from__"


class DroppedOptionWarning(UserWarning):
    """A preset's (or base's) option that the slot's new kind does not have was dropped."""


def is_slot(path: tuple[str, ...] | list[str]) -> bool:
    """``path`` is a slot table of the model config (``("model", "norm")``)."""
    return len(path) == 2 and path[0] == "model" and path[1] in SLOT_FIELDS


def own_keys(table: Mapping[str, Any]) -> list[str]:
    """The options a table sets itself (not those it carried over)."""
    carried = table.get(CARRIED) or {}
    return [k for k in table if k not in (CARRIED, "kind") and k not in carried]


def set_explicitly(table: dict[str, Any], keys: Iterable[str]) -> None:
    """``keys`` were set in ``table`` by the user: no longer carried over."""
    carried = table.get(CARRIED)
    if not carried:
        return
    left = {k: v for k, v in carried.items() if k not in set(keys)}
    if left:
        table[CARRIED] = left
    else:
        del table[CARRIED]


def switch_kind(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The slot table of ``new``'s kind over ``old`` (another kind's): ``new``'s keys plus the
    options of ``old`` that ``new`` does not set, carried over and marked (:data:`CARRIED`).
    Validation keeps those the new kind has and drops the others with a note naming them."""
    source = old.get("kind")
    before = old.get(CARRIED) or {}
    carried = {k: v for k, v in old.items() if k not in ("kind", CARRIED) and k not in new}
    out = {**carried, **new}
    marks = {**{k: before.get(k, source) for k in carried}, **(new.get(CARRIED) or {})}
    out.pop(CARRIED, None)
    if marks:
        out[CARRIED] = marks
    return out


def settle_carried(model: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A raw ``[model]`` table with every slot's carried-over options settled. An option still
    at its old kind's default was no choice (a dumped config lists every default): it goes, and
    the new kind's own default applies. Another one stays where the new kind has it and is
    dropped where it does not, with one note per slot naming those."""
    from attnlab.parts import registry

    out, notes = dict(model), []
    for slot in SLOT_FIELDS:
        table = out.get(slot)
        if not isinstance(table, Mapping) or CARRIED not in table:
            continue
        marks = table[CARRIED] if isinstance(table[CARRIED], Mapping) else {}
        table = {k: v for k, v in table.items() if k != CARRIED}
        kind = table.get("kind", registry.default_kind(slot))
        if isinstance(kind, str) and registry.has(slot, kind):
            sources = {k: marks[k] or registry.default_kind(slot) for k in marks if k in table}
            for k, source in sources.items():
                if _is_default(slot, source, k, table[k]):
                    del table[k]
            have = registry.get(slot, kind).options.model_fields
            dropped = [k for k in sources if k in table and k not in have]
            for k in dropped:
                del table[k]
            if dropped:
                names = ", ".join(repr(k) for k in dropped)
                kinds = " and ".join(repr(s) for s in sorted({sources[k] for k in dropped}))
                notes.append(
                    f"model.{slot}.kind = {kind!r} has no option{'s' if len(dropped) > 1 else ''} "
                    f"{names} (set for kind {kinds}), so "
                    f"{'they were' if len(dropped) > 1 else 'it was'} dropped"
                )
        out[slot] = table
    return out, notes


def _is_default(slot: str, kind: str, key: str, value: Any) -> bool:
    """``value`` is the default of option ``key`` of part ``kind`` (same type, same value)."""
    from attnlab.parts import registry

    if not registry.has(slot, kind):
        return False
    field = registry.get(slot, kind).options.model_fields.get(key)
    if field is None or field.is_required():
        return False
    default = field.get_default(call_default_factory=True)
    return type(default) is type(value) and default == value


def deliver_notes(notes: list[str], context: Any) -> None:
    """Into the validation context's ``notes`` list when the caller gave one (compare reports
    them per variant), else as a warning (one ``attnlab CMD: warning:`` line each)."""
    if isinstance(context, dict) and isinstance(context.get("notes"), list):
        context["notes"].extend(n for n in notes if n not in context["notes"])
        return
    for note in notes:
        warnings.warn(note, DroppedOptionWarning, stacklevel=2)
