"""``attnlab <command>``: every command lives in its own module under ``attnlab.commands``.

A command module defines ``NAME``, ``HELP`` and ``add_arguments(parser)`` and ``run(args) -> int``.
Expected user errors (a bad config, a missing file, bad data) print one clear message and exit 2;
system failures (a full disk, a file-size limit, out of memory, input nested too deeply) are
described the same way, never as a traceback. Exit codes: :mod:`attnlab.base.exitcodes`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import pkgutil
import signal
import sys
from collections.abc import Sequence

from attnlab import __version__
from attnlab.base import exitcodes
from attnlab.base.advice import RETRAIN, restart_as
from attnlab.base.errors import UserError
from attnlab.base.failures import SYSTEM_FAILURES, describe, os_error_of
from attnlab.base.import_noise import drop_import_noise
from attnlab.base.warning_lines import cli_warnings
from attnlab.commands._attention_lines import attention_lines
from attnlab.commands._common import add_plugin_argument, plugin_specs
from attnlab.parts.exits import as_error


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
        epilog=exitcodes.EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"attnlab {__version__}")
    add_plugin_argument(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in _command_modules():
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        add_plugin_argument(p)
        p.set_defaults(
            _run=mod.run,
            _restart=getattr(mod, "RESTART", RETRAIN),
            _attention=getattr(mod, "ATTENTION_LINES", "always"),
        )
    return parser


def _command_name(argv: list[str]) -> str:
    """The command word of ``argv`` (before the parser exists), for messages."""
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == "--plugin":
            skip = True
        elif not a.startswith("-"):
            return a
    return "attnlab"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _command_name(argv)
    drop_import_noise()  # torchao's CUDA-library lines when transformers imports it (CPU torch)
    # warnings print as one `attnlab CMD: warning: ...` line, like errors (warning_lines.py)
    with cli_warnings(command):
        try:
            code = _main(argv, command)
            sys.stdout.flush()
        except KeyboardInterrupt:  # Ctrl-C while the command was still starting (imports)
            print(f"attnlab {command}: interrupted", file=sys.stderr)
            return exitcodes.INTERRUPTED
        except BrokenPipeError:
            # the reader of our output stopped (`attnlab ... | head -1`): what the command did is
            # done; say nothing more and let the interpreter's last flush go nowhere
            _stdout_to_devnull()
            return exitcodes.OK
        return code


def _stdout_to_devnull() -> None:
    import os

    with contextlib.suppress(OSError, ValueError, AttributeError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)


#: a message line longer than this is cut (a huge value quoted back is no help to anyone)
MAX_LINE = 2000


def _cut_lines(message: str) -> str:
    """``message`` with each line over :data:`MAX_LINE` characters cut, its length named."""
    return "\n".join(
        line if len(line) <= MAX_LINE else f"{line[:MAX_LINE]}... ({len(line):,} characters; cut)"
        for line in message.split("\n")
    )


def _quiet_attention(args: argparse.Namespace) -> bool:
    """No attention path lines: ``--quiet``, or a command that shows them with ``--verbose``
    only (``ATTENTION_LINES = "verbose"``: check, whose battery runs every path on purpose)."""
    if getattr(args, "quiet", False):
        return True
    return args._attention == "verbose" and not getattr(args, "verbose", False)


def _main(argv: list[str], command: str) -> int:
    try:
        # plugins load before the parser is built and any config is validated
        from attnlab.parts.plugins import load_plugins

        plugins = load_plugins(plugin_specs(argv), missing="check the --plugin path")
    except UserError as e:
        print(f"attnlab {command}: error: {e}", file=sys.stderr)
        return exitcodes.USER_ERROR
    parser = build_parser()
    args = parser.parse_args(argv)
    args.plugins = plugins  # resolved (absolute) specs, as the configs record them
    if not getattr(args, "_run", None):
        parser.print_help(sys.stderr)
        print("attnlab: error: no command given; choose one of the commands above", file=sys.stderr)
        return exitcodes.USER_ERROR
    if hasattr(signal, "SIGXFSZ"):  # a file-size limit then fails the write (EFBIG), not us
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        # "how to start a run over", in this command's flags; the attention path each layer
        # runs, and why, once per distinct line on stderr
        with restart_as(args._restart), attention_lines(quiet=_quiet_attention(args)):
            return int(args._run(args) or exitcodes.OK)
    except BrokenPipeError:
        raise  # the output pipe closed: main() decides (see there)
    except UserError as e:
        print(f"attnlab {args.command}: error: {_cut_lines(str(e))}", file=sys.stderr)
        return int(getattr(e, "exit_code", exitcodes.USER_ERROR))
    except SYSTEM_FAILURES as e:
        print(f"attnlab {args.command}: error: {describe(e)}", file=sys.stderr)
        return exitcodes.USER_ERROR
    except Exception as e:  # a library's own exception type around an OS error (disk full)
        os_error = os_error_of(e)
        if os_error is None:
            raise  # a bug: keep its traceback
        print(f"attnlab {args.command}: error: {describe(os_error)}", file=sys.stderr)
        return exitcodes.USER_ERROR
    except KeyboardInterrupt:
        print(f"attnlab {args.command}: interrupted", file=sys.stderr)
        return exitcodes.INTERRUPTED
    except BaseException as e:  # sys.exit() in a plugin's code: a failure, never exit 0
        err = as_error(e, f"attnlab {args.command} ran")
        if err is None:
            raise
        print(f"attnlab {args.command}: error: {_cut_lines(str(err))}", file=sys.stderr)
        return int(err.exit_code)


if __name__ == "__main__":
    sys.exit(main())
