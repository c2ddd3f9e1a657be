"""attnlab parts: every registered part by slot, with its options, cost and origin."""

from __future__ import annotations

import argparse
import contextlib
import json
import typing
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from attnlab.base import exitcodes

NAME = "parts"
HELP = "List the registered parts by slot: options, declared costs, and where each comes from."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("slot", nargs="?", help="only this slot (e.g. query, side_branch)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _type_name(ann: Any) -> str:
    if typing.get_origin(ann) is typing.Literal:
        return "|".join(repr(a) for a in typing.get_args(ann))
    if isinstance(ann, type):
        return ann.__name__
    return str(ann).replace("typing.", "").replace("NoneType", "None")


def describe(spec) -> dict[str, Any]:
    """One part as plain data: slot, kind, source, summary, cost, options, declarations."""
    from attnlab.parts.slots import SLOTS, ProjectionPart

    cls = spec.cls
    options = {
        name: {
            "type": _type_name(f.annotation),
            "default": f.get_default(call_default_factory=True),
            "description": f.description or "",
        }
        for name, f in spec.options.model_fields.items()
        if name != "kind"
    }
    flags = []
    if issubclass(cls, ProjectionPart):
        fusable = cls.fused_weights is not ProjectionPart.fused_weights
        flags.append("fuses with Q/K/V" if fusable else "not fused")
    if cls.needs_attention_matrix:
        flags.append("needs the T x T matrix")
    if not cls.supports_kv_cache:
        flags.append("no KV cache")
    if SLOTS[spec.slot].can_probe(cls):
        flags.append(f"probe: {cls.probe_name or spec.kind}")
    doc = [" ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())]
    return {
        "slot": spec.slot,
        "kind": spec.kind,
        "config": SLOTS[spec.slot].config_field,
        "source": spec.source,
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "summary": doc[0] if doc else "",
        "param_label": cls.label(),
        "cost": cls.cost,
        "declares": flags,
        "options": options,
    }


def _short(source: str) -> str:
    """A plugin path relative to the working directory when it lies below it."""
    p = Path(source)
    if p.is_absolute():
        with contextlib.suppress(ValueError):
            return str(p.relative_to(Path.cwd()))
    return source


def run(args: argparse.Namespace) -> int:
    from attnlab.base.errors import UserError
    from attnlab.parts import SLOTS, registry

    if args.slot and args.slot not in SLOTS:
        raise UserError(f"unknown slot {args.slot!r}; slots: {', '.join(SLOTS)}")
    slots = [args.slot] if args.slot else list(SLOTS)
    rows = [describe(spec) for slot in slots for spec in registry.specs(slot)]
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return exitcodes.OK
    con = Console()
    for slot in slots:
        s = SLOTS[slot]
        table = Table(
            title=f"{slot}: {s.doc}  (config: {s.config_field}"
            + ("; optional: kind = 'none')" if s.optional else ")"),
            title_justify="left",
            show_lines=True,
        )
        table.add_column("kind")
        table.add_column("what it computes; cost")
        table.add_column("options")
        table.add_column("declares")
        table.add_column("from", overflow="fold")
        for row in (r for r in rows if r["slot"] == slot):
            opts = "\n".join(
                f"{k}: {v['type']} = {v['default']!r}" for k, v in row["options"].items()
            )
            what = row["summary"] + (f"\n{row['cost']}" if row["cost"] else "")
            cells = (  # a plugin's docstring, defaults and path as text, never markup
                row["kind"],
                what,
                opts or "—",
                "\n".join([f"params row: {row['param_label']}", *row["declares"]]),
                _short(row["source"]),
            )
            table.add_row(*(escape(c) for c in cells))
        con.print(table)
    return exitcodes.OK
