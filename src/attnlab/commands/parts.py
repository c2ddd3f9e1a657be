"""attnlab parts: every registered part by slot, with its options, cost and origin; ``attnlab
parts family``: every registered model family, with what it declares and its origin."""

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
HELP = (
    "List the registered parts by slot (options, declared costs, where each comes from), or the "
    "model families (`attnlab parts family`)."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("slot", nargs="?", help="only this slot (e.g. query, side_branch), or 'family'")
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


def describe_family(spec) -> dict[str, Any]:
    """One family as plain data: name, source, summary and its declarations."""
    fam = spec.family
    doc = " ".join((fam.__doc__ or "").strip().split("\n\n")[0].split())
    declares = [
        f"objective: {fam.objective.name}",
        "continues text (generate, bench)" if fam.continues_text else "does not generate",
        "K/V cache" if fam.decodes_with_cache else "no K/V cache",
        "exports (transformers causal LM)" if fam.exports else "no export",
    ]
    declares += [f"eval: {', '.join(fam.eval_routes) or 'none'}"]
    declares += [f"needs: {need}" for need in fam.data_needs]
    declares += ["padding_mask"] * fam.takes_padding_mask
    return {
        "family": spec.name,
        "source": spec.source,
        "class": f"{spec.cls.__module__}.{spec.cls.__qualname__}",
        "summary": doc,
        "objective": fam.objective.name,
        "declares": declares,
        "check_cases": [f"{c.mask}/{c.position}" for c in fam.check_cases],
    }


#: the columns of the families' table
COLUMNS = ("family", "what it is", "declares", "check cases", "from")


def _families(as_json: bool) -> int:
    from attnlab.parts import families

    rows = [describe_family(spec) for spec in families.specs()]
    if as_json:
        print(json.dumps(rows, indent=2, default=str))
        return exitcodes.OK
    table = Table(
        title="model families  (config: model.family)", title_justify="left", show_lines=True
    )
    for column in COLUMNS:
        table.add_column(column, overflow="fold")
    for row in rows:
        cells = (
            row["family"],
            row["summary"],
            "\n".join(row["declares"]),
            ", ".join(row["check_cases"]) or "—",
            _short(row["source"]),
        )
        table.add_row(*(escape(c) for c in cells))
    Console().print(table)
    return exitcodes.OK


def _short(source: str) -> str:
    """A plugin path relative to the working directory when it lies below it."""
    p = Path(source)
    if p.is_absolute():
        with contextlib.suppress(ValueError):
            return str(p.relative_to(Path.cwd()))
    return source


def run(args: argparse.Namespace) -> int:
    from attnlab.base.errors import UserError
    from attnlab.parts import SLOTS, families, registry

    if args.slot == families.SLOT:
        return _families(args.json)
    if args.slot and args.slot not in SLOTS:
        raise UserError(
            f"unknown slot {args.slot!r}; slots: {', '.join(SLOTS)} (or {families.SLOT!r}: "
            "the model families)"
        )
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
