"""``attnlab train CONFIG --out RUN_DIR``: pretrain from scratch; rerunning resumes."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
from pathlib import Path

from attnlab.base import exitcodes
from attnlab.base.advice import RERUN
from attnlab.base.errors import UserError
from attnlab.commands._common import (
    add_config_arguments,
    add_skip_argument,
    add_tp_argument,
    add_trust_argument,
    check_tp_args,
    config_from_args,
    trusting,
)

NAME = "train"
HELP = "train a model from scratch into RUN_DIR; the same command again resumes it"
#: how this command's user starts a run over (``attnlab.base.advice``)
RESTART = RERUN
EPILOG = f"""\
exit codes: {exitcodes.OK} finished (or already finished), {exitcodes.USER_ERROR} bad input, \
{exitcodes.DIVERGED} the run diverged (recorded in RUN_DIR/status.json), \
{exitcodes.INTERRUPTED} interrupted (rerun to resume)
"""
#: how this command's user starts a run over (``attnlab.base.advice``)
RESTART = RERUN


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = EPILOG
    add_config_arguments(p)
    p.add_argument("--out", required=True, metavar="RUN_DIR", help="the run directory")
    p.add_argument(
        "--restart",
        action="store_true",
        help="delete RUN_DIR's checkpoints, metrics and status and train from step 0",
    )
    p.add_argument(
        "--allow-plugin-change",
        action="store_true",
        help="resume although a plugin's source changed since the run recorded it (the change "
        "is recorded in RUN_DIR/plugins.json)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar or log lines")
    p.add_argument(
        "--init-from",
        metavar="hf:NAME|DIR",
        default=None,
        help="start from a GPT-2, GPT-NeoX or Llama checkpoint (a local Hugging Face folder, or "
        "hf:NAME online): its architecture becomes [model], its weights the initial parameters",
    )
    add_tp_argument(p)
    add_skip_argument(p)
    add_trust_argument(p)


def _say(msg: str) -> None:
    print(msg, flush=True)


def _remove_fresh(out: Path) -> None:
    """Remove the directory the lock just created (it holds the lock file and nothing else)."""
    if {p.name for p in out.iterdir()} <= {".lock", ".attnlab.json"}:
        shutil.rmtree(out, ignore_errors=True)


def _run_plugins(args: argparse.Namespace) -> list[str]:
    """Load the plugins the run in ``--out`` records (``plugins.json``) and return their specs,
    so that resuming it with its own command validates ``--set model.SLOT.kind=<a plugin's
    kind>`` without naming the plugin again. A recorded file that moved is served by ``--plugin
    NEWPATH`` (same file name; reported with both sha256), else refused with that advice; a
    changed source is refused later by the resume check unless ``--allow-plugin-change``.
    Nothing is loaded for ``--restart`` (the run starts afresh from the config given)."""
    from attnlab.parts.plugins import is_path_spec, load_plugin
    from attnlab.runs import rundir

    # made known first: a moved plugin is reported with the sha256 the run recorded
    records = rundir.recorded_plugins(args.out)
    if args.restart:
        return []
    specs = []
    for rec in records:
        spec = rec.get("spec")
        if not isinstance(spec, str) or rec.get("distribution") or spec.startswith("ep:"):
            continue  # an installed package's entry point loads by itself
        sha = str(rec.get("sha256") or "")[:12] or "-"
        hint = (
            f"the run in {args.out} was trained with it (plugins.json). If it moved, pass "
            f"--plugin NEWPATH: a file named {Path(spec).name if is_path_spec(spec) else spec}, "
            f"accepted when its sha256 matches the recorded {sha} (a changed source resumes "
            "only with --allow-plugin-change); to train afresh without it, pass --restart"
        )
        specs.append(load_plugin(spec, missing=hint).spec)
    return specs


def run(args: argparse.Namespace) -> int:
    with trusting(args):  # --init-from an export whose plugin code it carries
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from attnlab.base.safepath import check_out_dir
    from attnlab.runs import lock, rundir
    from attnlab.runs.preflight import check_training

    # a resumed run's own plugins first, before its config and --set are validated
    args.plugins = list(dict.fromkeys([*args.plugins, *_run_plugins(args)]))
    if args.init_from:
        from attnlab.base.extras import require

        require("hf", "transformers", "safetensors", what="--init-from")
        from attnlab.hf.init_from import config_with_init

        cfg = config_with_init(args.config, args.init_from, args.overrides, args.plugins)
    else:
        cfg = config_from_args(args)
    check_out_dir(args.out, "--out")
    check_tp_args(args, cfg.model)
    main = int(os.environ.get("RANK", "0")) == 0
    fresh = not Path(args.out).exists()
    # lock before the slow imports and the preflight, so a second process on the same --out
    # fails at once
    with lock.locked(args.out) if main else contextlib.nullcontext():
        try:
            from attnlab.runs.trackers import check_clients

            check_clients(cfg.train.loggers)
            if main:  # before anything is written: never a folder of the user's
                rundir.claim_run(args.out)
            check_training(cfg)
            if main:  # plugin parts are proven before the run uses them (cached per source)
                from attnlab.testing.gate import model_parts, record, require_checked

                checked = require_checked(model_parts([cfg.model]), skip=args.skip_check)
                record(args.out, checked)
        except UserError:
            if fresh and main:  # a refused run leaves nothing behind, not even its lock file
                _remove_fresh(Path(args.out))
            raise
        from attnlab.runs.progress import console_reporter
        from attnlab.train import train

        reporter = None if args.quiet or not main else console_reporter(cfg.train.log_every)
        result = train(
            cfg,
            args.out,
            progress=reporter,
            resume=not args.restart,
            allow_plugin_change=args.allow_plugin_change,
            tp=args.tp,
        )
    if not main:
        return exitcodes.OK
    val = "n/a" if result.final_val_loss is None else f"{result.final_val_loss:.4f}"
    best = "n/a" if result.best_val_loss is None else f"{result.best_val_loss:.4f}"
    if result.status == "diverged":
        print(
            f"attnlab train: diverged at step {result.steps}/{result.max_steps}: {result.reason}. "
            f"Recorded in {args.out}/status.json; lower train.lr or raise train.warmup_steps (or "
            "train.grad_clip below its value), then rerun with --restart",
            file=sys.stderr,
            flush=True,
        )
        return exitcodes.DIVERGED
    if result.already_done:
        _say(
            f"{args.out} already finished {result.steps} steps (val loss {val}, best {best}); "
            "nothing to do. Use --restart to train it again"
        )
    elif result.status == "finished":
        resumed = f", resumed from step {result.resumed_from}" if result.resumed_from else ""
        _say(
            f"finished {result.steps} steps{resumed}: val loss {val} (best {best}), "
            f"{result.tokens:,} tokens at {result.tokens_per_s:,.0f} tokens/s, "
            f"{result.wall_time:.1f} s; run in {args.out}"
        )
    else:
        _say(f"stopped at step {result.steps}/{result.max_steps} ({result.status})")
    return exitcodes.OK
