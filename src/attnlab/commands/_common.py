"""Arguments shared by commands that take a config."""

from __future__ import annotations

import argparse
import contextlib
import os

from attnlab.base.errors import UserError
from attnlab.config import Config, ConfigError, check_distinct, load_config


class SetAction(argparse._AppendAction):
    """``--set KEY=VALUE``, appended; one option set twice (one key with two values, or an old
    key name beside its new one) is a usage error naming both, not a silent last-one-wins."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        super().__call__(parser, namespace, values, option_string)
        try:
            check_distinct(getattr(namespace, self.dest))
        except ConfigError as e:
            parser.error(f"--set: {e}")


def add_config_arguments(p: argparse.ArgumentParser, positional: str = "config") -> None:
    p.add_argument(positional, metavar="NAME_OR_FILE", help="a preset name or a TOML config file")
    add_set_argument(p)


def add_set_argument(
    p: argparse.ArgumentParser,
    what: str = "a config value",
    example: str = "model.query.kind=nonlinear",
) -> None:
    """``--set KEY=VALUE`` (repeatable), collected in ``args.overrides``; the help reads
    "override WHAT, e.g. --set EXAMPLE (repeatable)"."""
    p.add_argument(
        "--set",
        dest="overrides",
        action=SetAction,
        default=[],
        metavar="KEY=VALUE",
        help=f"override {what}, e.g. --set {example} (repeatable)",
    )


def add_tp_argument(p: argparse.ArgumentParser) -> None:
    """``--tp N``: tensor parallelism over N ranks of a ``torchrun`` job (``args.tp``)."""
    p.add_argument(
        "--tp",
        type=int,
        default=1,
        metavar="N",
        help="split the model over N processes by tensor parallelism (heads, MLP units and the "
        "vocabulary; under torchrun, N dividing the processes and the heads; default 1)",
    )


def check_tp_args(args: argparse.Namespace, model_cfg) -> None:
    """Refuse a ``--tp`` this job cannot run (no torchrun, not dividing the processes or the
    heads) before anything is read or written."""
    tp = getattr(args, "tp", 1)
    if tp == 1:
        return
    from attnlab.model.tensor_parallel import check_tp
    from attnlab.runs.distributed import check_tp_world

    check_tp_world(tp, int(os.environ.get("WORLD_SIZE", "1")))
    check_tp(model_cfg, tp)


def add_plugin_argument(p: argparse.ArgumentParser) -> None:
    """``--plugin`` on every command (the CLI also loads them before parsing)."""
    p.add_argument(
        "--plugin",
        dest="plugins",
        action="append",
        default=[],
        metavar="MODULE_OR_FILE",
        help="import a module or .py file that registers parts (repeatable); recorded in the "
        "run's config as plugins = [...]",
    )


def add_trust_argument(p: argparse.ArgumentParser) -> None:
    """``--trust-remote-code``: consent to run code a model folder carries
    (:mod:`attnlab.base.consent`), on every command that loads one."""
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="run the code a model folder carries (an export's plugin parts and their helpers, "
        "a Hugging Face folder's own modeling code, a plugin file inside a received run or "
        "probe directory); read it first. Without it such a folder is refused",
    )


def trusting(args: argparse.Namespace) -> contextlib.AbstractContextManager:
    """The consent ``--trust-remote-code`` gave, for the duration of a command."""
    from attnlab.base.consent import trusting_remote_code

    return trusting_remote_code(bool(getattr(args, "trust_remote_code", False)))


def add_skip_argument(p: argparse.ArgumentParser) -> None:
    """``--skip-check``: run without the conformance check of the plugin parts used (the check
    runs once per plugin source, cached; see :mod:`attnlab.testing.gate`)."""
    p.add_argument(
        "--skip-check",
        dest="skip_check",
        action="store_true",
        help="do not run the conformance check (attnlab check) on the plugin parts used; the "
        "run records that it was skipped (check.json)",
    )


def plugin_specs(argv: list[str]) -> list[str]:
    """The ``--plugin`` values anywhere in ``argv`` (``--plugin X`` or ``--plugin=X``)."""
    out = []
    for i, a in enumerate(argv):
        if a == "--plugin" and i + 1 < len(argv):
            out.append(argv[i + 1])
        elif a.startswith("--plugin="):
            out.append(a.split("=", 1)[1])
    return out


def config_from_args(args: argparse.Namespace, positional: str = "config") -> Config:
    return load_config(getattr(args, positional), args.overrides, getattr(args, "plugins", []))


def add_launcher_arguments(p: argparse.ArgumentParser, jobs_help: str) -> None:
    """``--jobs N``, ``--launcher`` and ``--launcher-arg KEY=VALUE``: how the runs of an experiment
    (compare, ladder) execute; ``check_launcher_args`` validates them."""
    p.add_argument("--jobs", type=int, default=1, metavar="N", help=jobs_help)
    p.add_argument(
        "--launcher",
        choices=("local", "slurm", "submitit-local"),
        default="local",
        help="where runs execute: this machine (default), Slurm jobs through submitit (needs "
        "submitit: pip install 'submitit>=1.5'), or submitit's local executor (a subprocess "
        "per run, all at once; to try the submitit path without a cluster)",
    )
    p.add_argument(
        "--launcher-arg",
        dest="launcher_args",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a submitit executor parameter (repeatable), e.g. slurm_partition=gpu, "
        "gpus_per_node=1, cpus_per_task=8, timeout_min=240 (the default), mem_gb=32",
    )


def check_launcher_args(args: argparse.Namespace) -> None:
    """Refuse ``--jobs`` below 1 and ``--launcher-arg`` without a submitit launcher."""
    if args.jobs < 1:
        raise UserError("--jobs must be at least 1")
    if args.launcher_args and args.launcher == "local":
        raise UserError("--launcher-arg sets submitit parameters; add --launcher slurm")
