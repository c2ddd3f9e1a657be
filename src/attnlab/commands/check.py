"""attnlab check: prove parts, built-in or plugin, with the conformance battery."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from attnlab.base import exitcodes

NAME = "check"
HELP = (
    "Prove parts with the conformance battery (causality, KV cache, batching, declared params "
    "and FLOPs, state dict, init, gradcheck, µP coordinate check, compile, bfloat16, export)."
)
EPILOG = f"""\
Without SLOT:KIND it checks the parts of the --plugin files given, or every registered part when
there are none (--all: every registered part in any case).
exit codes: {exitcodes.OK} every property passed or was skipped with its reason, \
{exitcodes.FAILED} some property failed, {exitcodes.USER_ERROR} bad input (an unknown SLOT:KIND, \
a bad option)
"""
#: the attention path lines (the battery runs every path on purpose) with --verbose only
ATTENTION_LINES = "verbose"

#: short column names of the properties, in battery order
COLUMNS = {
    "effect": "effect",
    "causality": "causal",
    "kv_cache": "cache",
    "fused": "fused",
    "batch": "batch",
    "params": "params",
    "flops": "flops",
    "state_dict": "state",
    "init": "init",
    "gradcheck": "grad",
    "coord_check": "coord",
    "compile": "compile",
    "bfloat16": "bf16",
    "export": "export",
    "quantize": "quant",
    "tp": "tp",
}
#: the table's width: a part name (about 40 characters) and a column per property, each its
#: label's width or the 4 of "FAIL", with rich's 3 characters of padding and border
WIDTH = 46 + sum(max(len(label), 4) + 3 for label in COLUMNS.values())
MARK = {"passed": "[green]ok[/]", "failed": "[bold red]FAIL[/]", "skipped": "[dim]-[/]"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = EPILOG
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument(
        "parts",
        nargs="*",
        metavar="SLOT:KIND[,option=value...]",
        help="the parts to check, e.g. score:virtual_heads,kernel_size=2 (default: see below)",
    )
    p.add_argument("--all", action="store_true", help="every registered part (and the plugins')")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile property")
    p.add_argument(
        "--compile-backend",
        choices=("aot_eager", "inductor"),
        default="aot_eager",
        help="aot_eager (default): dynamo's tracing and AOTAutograd, eager kernels, about a second "
        "a part; inductor: also its C++ kernels, as train.compile (minutes on a cold cache)",
    )
    p.add_argument("--no-export", action="store_true", help="skip the transformers export")
    p.add_argument(
        "--with-tp",
        action="store_true",
        help="also the tp property: each part's model split by tensor parallelism over 2 gloo "
        "processes equals it whole (every part in one pair of processes; tens of seconds)",
    )
    p.add_argument("--verbose", "-v", action="store_true", help="also every passed/skipped line")
    p.add_argument(
        "--quiet",
        "-q",
        action="store_true",
        help="no progress on stderr (which part and property is being checked)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON list of part reports")


def parse_part(text: str):
    """``SLOT:KIND[,option=value...]`` -> PartRequest (values read as TOML, else strings)."""
    from attnlab.base.errors import UserError
    from attnlab.config import parse_override
    from attnlab.parts import SLOTS
    from attnlab.parts.registry import PartError, unknown_kind_message
    from attnlab.testing import PartRequest

    slot, sep, rest = text.partition(":")
    kind, *items = rest.split(",")
    if not sep or not slot or not kind.strip():
        raise UserError(
            f"{text!r} is not SLOT:KIND[,option=value...]; e.g. query:nonlinear,ratio=0.25"
        )
    slot, kind = slot.strip(), kind.strip()
    if slot not in SLOTS:
        raise UserError(f"unknown slot {slot!r} in {text!r}; slots: {', '.join(SLOTS)}")
    from attnlab.parts import registry

    if not registry.has(slot, kind) or kind == "none":
        raise PartError(unknown_kind_message(slot, kind))
    options: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise UserError(f"option {item!r} in {text!r} must look like option=value")
        path, value = parse_override(item)
        options[".".join(path)] = value
    return PartRequest(slot, kind, options)


def requests(args: argparse.Namespace) -> list:
    from attnlab.parts import registry
    from attnlab.parts.plugins import loaded
    from attnlab.testing import PartRequest

    if args.parts:
        return [parse_part(p) for p in args.parts]
    specs = registry.specs()
    if args.plugins and not args.all:
        given = set(args.plugins)
        modules = {r.module for r in loaded() if r.spec in given}

        def mine(s) -> bool:  # registered while the plugin loaded (a helper's class too)
            m = s.cls.__module__
            return s.source in given or any(m == x or m.startswith(f"{x}.") for x in modules)

        specs = [s for s in specs if s.source != registry.BUILTIN and mine(s)]
    return [PartRequest(s.slot, s.kind, {}) for s in specs]


class Progress:
    """Which part and property the battery is on, on stderr: one status line that changes on a
    terminal, a line per part and per finished property otherwise (a slow part is never
    silent)."""

    def __init__(self, quiet: bool) -> None:
        from rich.console import Console

        self.con = Console(stderr=True)
        self.quiet = quiet
        self.live = self.con.is_terminal and not quiet
        self.status = None

    def __call__(self, part: str, i: int, n: int, prop: str, result) -> None:
        from rich.markup import escape

        if self.quiet:
            return
        label = f"[{i}/{n}] {part}"
        if self.live:
            text = f"checking {escape(label)}: {prop} ..."
            if self.status is None:
                self.status = self.con.status(text)
                self.status.start()
            else:
                self.status.update(text)
        elif result is None and prop == "build":
            self._line(f"attnlab check: {label} ...")
        elif result is not None:
            self._line(f"attnlab check: {label} {prop}: {result.status} ({result.seconds:.1f} s)")

    def _line(self, text: str) -> None:
        self.con.print(text, markup=False, highlight=False, soft_wrap=True)

    def close(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None


def _families_hint(args: argparse.Namespace) -> str:
    """For plugins that register families: how their check cases are run."""
    from attnlab.parts import families

    given = set(args.plugins or ())
    names = [s.name for s in families.specs() if s.source in given]
    if not names:
        return ""
    return (
        f"; they register the model famil{'ies' if len(names) > 1 else 'y'} "
        f"{', '.join(map(repr, names))}, whose check cases join every part's: `attnlab check "
        "--all --plugin FILE` checks every part in them too (or name parts: SLOT:KIND)"
    )


def run(args: argparse.Namespace) -> int:
    from attnlab.base.errors import UserError
    from attnlab.testing import check_parts

    todo = requests(args)
    if not todo:
        raise UserError(
            "no parts to check: the --plugin files register none" + _families_hint(args)
        )
    t0 = time.perf_counter()
    if not args.json:
        print(f"checking {len(todo)} part(s) in float64 small models on the CPU ...", flush=True)
    progress = Progress(args.quiet)
    try:
        reports = check_parts(
            todo,
            compile=not args.no_compile,
            export=not args.no_export,
            tp=args.with_tp,
            compile_backend=args.compile_backend,
            steps=progress,
        )
    finally:
        progress.close()
    wall = time.perf_counter() - t0
    _cache(args, reports)
    if args.json:
        print(json.dumps([r.to_dict() for r in reports], indent=2, default=str))
    else:
        _print(args, reports, wall)
    return exitcodes.FAILED if any(not r.passed for r in reports) else exitcodes.OK


def _cache(args: argparse.Namespace, reports: list) -> None:
    """A plugin's passing result spares train/compare/probe/bench the check."""
    from attnlab.parts import registry
    from attnlab.testing import cache as check_cache
    from attnlab.testing.gate import ALL, NO_EXPORT, what

    if args.no_compile:
        return
    ran = what(NO_EXPORT if args.no_export else ALL, args.compile_backend)
    for r in reports:
        spec = registry.get(r.slot, r.kind)
        if spec.source != registry.BUILTIN:
            check_cache.write(check_cache.key(spec.cls, r.slot, r.kind, r.options, ran), r)


def _print(args: argparse.Namespace, reports: list, wall: float) -> None:
    """The table, where each plugin part comes from, the failures (every line with --verbose)
    and the verdict. Every name, path and message is printed as text, never as markup (a part
    named ``query.nonlinear[ratio=0.25]`` keeps its brackets)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from attnlab.testing.result import WHOLE

    con = Console()
    if con.width < WIDTH:  # a pipe or a narrow terminal: the table needs its columns
        con = Console(width=WIDTH)
    narrow = Console(width=min(con.width, 100))  # the sentences below the table
    table = Table(title="attnlab check: conformance of each part", title_justify="left")
    table.add_column("part", no_wrap=True, min_width=max(len(r.name) for r in reports))
    for col in COLUMNS.values():
        table.add_column(col, justify="center")
    table.add_column("s", justify="right")
    for r in reports:
        by = {x.name: x.status for x in r.results}
        whole = any(w in by for w in WHOLE)
        cells = [MARK.get(by.get(p, ""), "[bold red]FAIL[/]" if whole else "") for p in COLUMNS]
        table.add_row(escape(r.name), *cells, f"{r.seconds:.1f}")
    con.print(table)
    for r in reports:
        if r.source != "built-in":
            con.print(f"{r.name} is from {_short(r.source)}", markup=False, highlight=False)
    bad = [r for r in reports if not r.passed]
    for r in reports:
        lines = [x for x in r.results if x.status == "failed" or args.verbose]
        if args.verbose and r.refused:
            refused = "; ".join(f"{c}: {why}" for c, why in r.refused)
            narrow.print(
                f"[bold]{escape(r.name)}[/] configs refused by its options or the config: "
                f"{escape(refused)}",
                highlight=False,
            )
        for x in lines:
            style = "red" if x.status == "failed" else "dim"
            narrow.print(f"[{style}]{escape(r.name)} {escape(x.message())}[/]", highlight=False)
    n_fail = sum(1 for r in reports for x in r.results if x.status == "failed")
    verdict = (
        f"{len(bad)} of {len(reports)} part(s) failed {n_fail} propert(ies)"
        if bad
        else (f"all {len(reports)} part(s) passed")
    )
    con.print(f"{verdict} in {wall:.1f} s (skips name their reason: --verbose)", highlight=False)


def _short(source: str) -> str:
    from attnlab.commands.parts import _short as short

    return short(source)
