"""Arguments shared by commands that take a config."""

from __future__ import annotations

import argparse

from attnlab.config import Config, load_config


def add_config_arguments(p: argparse.ArgumentParser, positional: str = "config") -> None:
    p.add_argument(positional, metavar="NAME_OR_FILE", help="a preset name or a TOML config file")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set model.query.kind=nonlinear (repeatable)",
    )


def config_from_args(args: argparse.Namespace, positional: str = "config") -> Config:
    return load_config(getattr(args, positional), args.overrides)
