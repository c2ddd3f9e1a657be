"""attnlab probe: train attnlab's parts (or LoRA) on a frozen pretrained Hugging Face causal LM."""

from __future__ import annotations

import argparse

from attnlab.base import exitcodes
from attnlab.base.advice import RERUN
from attnlab.commands._common import (
    add_set_argument,
    add_skip_argument,
    add_trust_argument,
    trusting,
)

NAME = "probe"
HELP = "frozen probe: inject pre-projection / content skip / anchored query (or LoRA) into a pretrained LM"
#: how this command's user starts a run over (``attnlab.base.advice``)
RESTART = RERUN

EPILOG = """\
methods: frozen, lora, preproj, skip, anchored-query and their '+' combinations
  (preproj+skip, preproj+lora, preproj+skip+anchored-query, ...); 'lora@preproj+skip' solves
  the LoRA rank so its actual trainable count matches preproj+skip.
base.model: a hub id (online), a local Hugging Face directory, a .gguf file, or smollm2-135m.

  attnlab probe configs/probe/smollm2.toml --out runs/probe --set method=preproj+skip
  attnlab probe configs/probe/smollm2-table2.toml --out runs/table2     (an experiment file)
  attnlab eval runs/probe --tasks perplexity                             (re-attach and evaluate)
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_skip_argument(p)
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = EPILOG
    p.add_argument(
        "config",
        nargs="?",
        metavar="CONFIG.toml",
        help="a probe config, or an experiment file with a 'methods' list (omit for the defaults)",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="run (or experiment) directory")
    add_set_argument(p, example="train.max_steps=50")
    p.add_argument("--method", help="shortcut for --set method=METHOD (single-method configs)")
    p.add_argument(
        "--restart", action="store_true", help="delete the run's progress and start over"
    )
    p.add_argument(
        "--data-root", default="data", metavar="DIR", help="where prepared corpora live (data/)"
    )
    add_trust_argument(p)


def _print_table(rows: list[dict], title: str) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from attnlab.probe.report import _fmt, columns

    table = Table(title=escape(title))  # run names and methods as text, never markup
    cols = columns(rows)
    for c in cols:
        table.add_column(escape(c), justify="left" if c == "method" else "right")
    for r in rows:
        table.add_row(*[escape(str(_fmt(c, r.get(c)))) for c in cols])
    Console().print(table)


def _check_parts(configs: list, out, args: argparse.Namespace) -> None:
    """The conformance check of the plugin parts the probe injects, recorded in OUT/check.json."""
    from attnlab.probe.methods import find_component
    from attnlab.testing.gate import record, require_checked

    parts = []
    for cfg in configs:
        for name in cfg.parsed_method.components:
            comp = find_component(name)
            if comp is not None:
                parts.append((comp.slot, cfg.part_options(comp)))
    record(out, require_checked(parts, skip=args.skip_check))


def run(args: argparse.Namespace) -> int:
    with trusting(args):  # a base model folder's code (an export's plugins, auto_map modules)
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from attnlab.base.errors import UserError
    from attnlab.base.extras import require

    require("probe", "transformers", "peft", "accelerate", "gguf", what="attnlab probe")
    from attnlab.base.safepath import check_out_dir
    from attnlab.probe.config import is_experiment_file, load_probe_config

    overrides = list(args.overrides) + ([f"method={args.method}"] if args.method else [])
    out = check_out_dir(args.out)
    if args.config and is_experiment_file(args.config):
        if args.method:
            raise UserError("--method picks one method; an experiment file lists its own methods")
        from attnlab.probe.config import load_experiment
        from attnlab.probe.experiment import claim_probe_experiment, result_row, run_experiment

        claim_probe_experiment(out)  # a folder of the user's is refused before check.json
        _check_parts(load_experiment(args.config, overrides, args.plugins)[1], out, args)

        results = run_experiment(
            args.config,
            out,
            overrides,
            restart=args.restart,
            data_root=args.data_root,
            plugins=args.plugins,
        )
        _print_table([result_row(r) for r in results], f"frozen probe -> {out}/report.md")
        return exitcodes.OK if all(r.status != "failed" for r in results) else exitcodes.FAILED
    from attnlab.probe.experiment import result_row, write_experiment_report
    from attnlab.probe.trainer import claim_probe_run, train_probe
    from attnlab.runs import lock

    cfg = load_probe_config(args.config, overrides, args.plugins)
    claim_probe_run(out)  # a folder of the user's is refused before check.json
    _check_parts([cfg], out, args)
    with lock.locked(out, "probe directory"):  # the run and its report: one writer
        res = train_probe(cfg, out, restart=args.restart, data_root=args.data_root)
        write_experiment_report(out, cfg.label, cfg, [res])
    _print_table([result_row(res)], f"frozen probe -> {out}")
    return exitcodes.OK if res.status == "finished" else exitcodes.FAILED
