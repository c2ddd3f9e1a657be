"""``attnlab <command>``: every command lives in its own module under ``attnlab.commands``.

A command module defines ``NAME``, ``HELP`` and ``add_arguments(parser)`` and ``run(args) -> int``.
Expected user errors (a bad config, a missing file, bad data) print one clear message and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

from attnlab import __version__
from attnlab.commands._common import add_plugin_argument, plugin_specs
from attnlab.errors import UserError


def _command_modules() -> list:
    import attnlab.commands as pkg

    mods = []
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        if not info.name.startswith("_"):
            mods.append(importlib.import_module(f"attnlab.commands.{info.name}"))
    return mods


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnlab",
        description="A laboratory for transformer attention-block designs.",
    )
    parser.add_argument("--version", action="version", version=f"attnlab {__version__}")
    add_plugin_argument(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in _command_modules():
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        add_plugin_argument(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), "attnlab")
    try:
        # plugins load before the parser is built and any config is validated
        from attnlab.parts.plugins import load_plugins

        plugins = load_plugins(plugin_specs(argv))
    except UserError as e:
        print(f"attnlab {command}: error: {e}", file=sys.stderr)
        return 2
    parser = build_parser()
    args = parser.parse_args(argv)
    args.plugins = plugins  # resolved (absolute) specs, as the configs record them
    if not getattr(args, "_run", None):
        parser.print_help()
        return 1
    try:
        return int(args._run(args) or 0)
    except UserError as e:
        print(f"attnlab {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"attnlab {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
