"""The probe's part tables, ``[probe.<slot>]``: the options of the part a method injects in that
slot, in the words of a training config's ``[model.<slot>]``::

    method = "preproj+skip"
    [probe.feature_map]
    kind = "pre_projection"   # may be left out: the method's part in that slot
    expansion = 2.0

The method decides what is injected; a table holds the options of the part of its ``kind``
(validated by that part's own options class, as ``model.<slot>`` is). A table whose kind is not
the method's part in that slot contradicts the method and is refused; a table of a slot the
method leaves empty is kept and unused (an experiment's methods share one file). In an
experiment, a method's own table replaces a shared one of another kind
(:func:`method_tables`). The tables of earlier versions, ``[parts.NAME]``, are read through
the one table of old keys (:func:`attnlab.config.legacy.moved_probe_parts`) with a note.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attnlab.base.schema import PartOptions, Section, slot_field
from attnlab.config import ConfigError, moved_probe_parts
from attnlab.parts import registry
from attnlab.probe.methods import (
    DEFAULT_METHOD,
    Component,
    MethodError,
    component_names,
    find_component,
    parse_method,
)

FeatureMapTable = slot_field("feature_map")
SideBranchTable = slot_field("side_branch")
QueryTable = slot_field("query")


class ProbeParts(Section):
    """``[probe]``: one table per slot a probe can inject into (``attnlab.parts.slots``' probe
    slots), each naming a part (``kind``) and holding its options; None: its defaults."""

    feature_map: FeatureMapTable | None = None
    side_branch: SideBranchTable | None = None
    query: QueryTable | None = None

    def options(self, comp: Component) -> PartOptions:
        """The options of an injected part: its slot's table when it is of that kind, else the
        part's defaults."""
        table = getattr(self, comp.slot)
        if table is not None and table.kind == comp.kind:
            return table
        return registry.get(comp.slot, comp.kind).options(kind=comp.kind)


def used_kinds(method: Any) -> dict[str, list[str]]:
    """slot -> the kinds a method string injects there, then those its ``@target`` counts (whose
    options size the LoRA rank); {} for a method that does not parse (validation names it)."""
    try:
        parsed = parse_method(str(method))
    except MethodError:
        return {}
    out: dict[str, list[str]] = {}
    for m in (parsed, parsed.lora_match):
        for comp in m.injects if m is not None else ():
            kinds = out.setdefault(comp.slot, [])
            if comp.kind not in kinds:
                kinds.append(comp.kind)
    return out


def locate(name: str) -> tuple[str, str]:
    """(slot, kind) of an injectable part's kind or probe name; ConfigError for another."""
    comp = find_component(name)
    if comp is None:
        raise ConfigError(
            f"parts.{name}: no injectable part is called {name!r}; parts here: "
            f"{', '.join(c for c in component_names() if c != 'lora')}"
        )
    return comp.slot, comp.kind


def in_todays_tables(raw: Mapping[str, Any], notes: list[str]) -> dict[str, Any]:
    """``raw`` with its old ``[parts.NAME]`` tables as ``[probe.<slot>]`` tables (a note each
    into ``notes``) and each ``[probe.<slot>]`` table's ``kind`` filled in from the method.
    Raises :class:`ConfigError` for a table with no kind in a slot the method leaves empty."""
    method = raw.get("method", DEFAULT_METHOD)
    used = used_kinds(method)
    out, moved = moved_probe_parts(raw, locate, used)
    notes.extend(n for n in moved if n not in notes)
    tables = out.get("probe")
    if not isinstance(tables, Mapping):
        return out
    tables = dict(tables)
    for slot, table in tables.items():
        if not isinstance(table, Mapping) or "kind" in table or slot not in ProbeParts.model_fields:
            continue  # validation words the problem
        if not used.get(slot):
            raise ConfigError(
                f"probe.{slot} names no kind and method {method!r} injects no {slot} part; "
                f"set probe.{slot}.kind (the part it configures) or leave the table out"
            )
        tables[slot] = {**table, "kind": used[slot][0]}
    if not tables and "probe" not in raw:
        return {k: v for k, v in out.items() if k != "probe"}
    return {**out, "probe": tables}


def table_problems(parts: ProbeParts, method: str) -> list[str]:
    """A table whose part is not the one the method injects in its slot."""
    problems = []
    for slot, kinds in used_kinds(method).items():
        table = getattr(parts, slot, None)
        if table is not None and table.kind not in kinds:
            problems.append(
                f"probe.{slot}.kind={table.kind!r} but method {method!r} injects "
                f"{kinds[0]!r} there; set probe.{slot}.kind={kinds[0]!r} (or leave kind out) "
                "to configure it"
            )
    return problems


def method_tables(
    shared: Mapping[str, Any], own: Mapping[str, Any], method: str, notes: list[str]
) -> Any:
    """An experiment method's ``[probe]`` tables: its own (``own``, its ``[[methods]]`` keys)
    over the shared ones, old ``[parts]`` tables of either read as today's (a note each into
    ``notes``). A shared table of another part than the method's in that slot, or with no kind
    in a slot the method leaves empty, is left out: it configures other methods' parts. The
    method's own table of another kind replaces the shared one."""
    used = used_kinds(method)
    base, moved = moved_probe_parts(shared, locate, used)
    mine, moved_own = moved_probe_parts(own, locate, used)
    notes.extend(n for n in (*moved, *moved_own) if n not in notes)
    tables, over = base.get("probe", {}), mine.get("probe", {})
    if not isinstance(tables, Mapping) or not isinstance(over, Mapping):
        return over if not isinstance(over, Mapping) else tables  # validation words it
    out = {}
    for slot, table in tables.items():
        kind = table.get("kind") if isinstance(table, Mapping) else None
        if kind in used.get(slot, []) or (kind is None) == bool(used.get(slot)):
            out[slot] = table
    for slot, table in over.items():
        before = out.get(slot)
        same = isinstance(before, Mapping) and isinstance(table, Mapping)
        if same and table.get("kind", before.get("kind")) == before.get("kind"):
            out[slot] = {**before, **table}
        else:
            out[slot] = table
    return out
