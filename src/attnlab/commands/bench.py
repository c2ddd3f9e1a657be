"""``attnlab bench``: training throughput, MFU, inference speed and memory of every block variant,
against nanoGPT, Hugging Face GPT-2 and x-transformers at the same config."""

from __future__ import annotations

import argparse
import contextlib
import json

from attnlab.base import exitcodes
from attnlab.base.errors import UserError
from attnlab.commands._common import add_set_argument, add_skip_argument, add_tp_argument

NAME = "bench"
HELP = (
    "time training (tokens/s, MFU vs a measured peak), decoding (with/without KV cache) and memory "
    "of the block variants and of peers at equal config"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_skip_argument(p)
    from attnlab.bench.peers import PEERS
    from attnlab.bench.runner import SECTIONS
    from attnlab.bench.variants import variant_names

    p.add_argument(
        "config",
        nargs="?",
        metavar="NAME_OR_FILE",
        help="a preset or TOML file (default tiny), or a quantized directory (attnlab quantize): "
        "its decoding against its source run's",
    )
    p.add_argument("--preset", metavar="NAME", help="a preset name (same as the positional)")
    add_set_argument(p, "the base config", "model.d_model=256")
    p.add_argument(
        "--variants",
        default="all",
        metavar="LIST",
        help=f"comma list or all/none (default all): {', '.join(variant_names())}; with "
        "--plugin, each part the plugin registers is a variant named by its kind",
    )
    p.add_argument(
        "--variant",
        dest="extra_variants",
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE[,KEY=VALUE]",
        help="an extra variant: model overrides of the base config, e.g. "
        "'mine:query.kind=gated,side_branch.kind=low_rank_skip' (parts of a --plugin too); "
        "repeatable, joins --variants",
    )
    p.add_argument(
        "--peers",
        default="all",
        metavar="LIST",
        help=f"comma list or all/none (default all): {', '.join(PEERS)}",
    )
    p.add_argument("--batch-size", type=int, metavar="B", help="default: train.batch_size")
    p.add_argument("--seq-len", type=int, metavar="T", help="default: data.seq_len")
    p.add_argument("--steps", type=int, default=3, metavar="N", help="timed steps per round")
    p.add_argument("--repeats", type=int, default=5, metavar="R", help="interleaved timed rounds")
    p.add_argument("--warmup", type=int, default=1, metavar="W", help="untimed rounds first")
    p.add_argument("--threads", type=int, metavar="T", help="torch CPU threads (default: torch's)")
    p.add_argument("--device", default="cpu", help="cpu, cuda[:N] or auto (default cpu)")
    p.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        help="compute dtype (autocast; default float32 on CPU, bfloat16 on CUDA)",
    )
    p.add_argument("--compile", action="store_true", help="torch.compile every model")
    p.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        metavar="LIST",
        help=f"what to measure (default all): {', '.join(SECTIONS)}",
    )
    p.add_argument(
        "--data",
        metavar="DIR",
        help="retrieval configs: a prepared data folder whose training tokens the timed BM25 "
        "lookups search (default: a synthetic database)",
    )
    p.add_argument("--prompt-len", type=int, default=16, metavar="N")
    p.add_argument("--new-tokens", type=int, metavar="N", help="decoded tokens (default <= 64)")
    p.add_argument("--decode-batch", type=int, default=1, metavar="B")
    p.add_argument("--decode-repeats", type=int, default=3, metavar="R")
    p.add_argument(
        "--out",
        metavar="FILE",
        help="write FILE.md and FILE.json (new files; an earlier result of attnlab's with --force)",
    )
    p.add_argument(
        "--save", action="store_true", help="write the result into benchmarks/results/ by machine"
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an earlier result of attnlab bench at --out (or --save's or --targets' "
        "name), unedited; never a file it did not write",
    )
    p.add_argument(
        "--targets",
        action="store_true",
        help="run the CPU target checks (fixed config d=256, 6 layers, T=256, 2 threads) and "
        "write benchmarks/results/cpu-<cpu>-<date>.md/.json",
    )
    add_tp_argument(p)
    p.add_argument("--json", action="store_true", help="print the result as JSON, no tables")
    p.add_argument("--list", action="store_true", help="list the variants and peers and exit")


def _list() -> int:
    from attnlab.bench.peers import PEERS, SUMMARIES
    from attnlab.bench.variants import find_variant, variant_names

    for v in filter(None, map(find_variant, variant_names())):
        sets = " ".join(f"--set model.{o}" for o in v.overrides) or "(the base config)"
        sets = sets.replace("{n_layers}", "<base n_layers>")
        print(f"{v.name:<24} {v.summary}\n{'':<24} {sets}")
    for name in PEERS:
        print(f"{name:<24} peer: {SUMMARIES[name]}")
    return exitcodes.OK


def _check_counts(args: argparse.Namespace) -> None:
    """Every count flag in range before anything is built (0 must not mean "the default")."""
    for flag, value, low in (
        ("--batch-size", args.batch_size, 1),
        ("--seq-len", args.seq_len, 1),
        ("--steps", args.steps, 1),
        ("--repeats", args.repeats, 1),
        ("--warmup", args.warmup, 0),
        ("--prompt-len", args.prompt_len, 1),
        ("--new-tokens", args.new_tokens, 1),
        ("--decode-batch", args.decode_batch, 1),
        ("--decode-repeats", args.decode_repeats, 1),
    ):
        if value is not None and value < low:
            raise UserError(f"{flag} {value} must be at least {low}")


def _spec(args: argparse.Namespace):
    from attnlab.bench.peers import PEERS
    from attnlab.bench.runner import SECTIONS, BenchSpec
    from attnlab.bench.variants import add_variant, parse_names, variant_names
    from attnlab.config import load_config

    if args.config and args.preset:
        raise UserError("give a config either as NAME_OR_FILE or with --preset, not both")
    name = args.config or args.preset or "tiny"
    config = load_config(name, args.overrides, args.plugins)  # a config's own plugins load here
    extra = [add_variant(text) for text in args.extra_variants]
    known = tuple(v for v in variant_names() if v not in extra)
    variants = parse_names(args.variants, known, "variant")
    return BenchSpec(
        config=config,
        config_name=name + "".join(f" --set {o}" for o in args.overrides),
        variants=[*variants, *extra],
        peers=parse_names(args.peers, PEERS, "peer"),
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        steps=args.steps,
        warmup=args.warmup,
        repeats=args.repeats,
        threads=args.threads,
        device=args.device,
        dtype=args.dtype,
        compile=args.compile,
        sections=tuple(parse_names(args.sections, SECTIONS, "section")),
        prompt_len=args.prompt_len,
        new_tokens=args.new_tokens,
        decode_batch=args.decode_batch,
        decode_repeats=args.decode_repeats,
        data=args.data,
    )


def run(args: argparse.Namespace) -> int:
    import sys

    from attnlab.base.devices import check_device, check_threads
    from attnlab.bench.report import (
        claim_results,
        failure_lines,
        print_report,
        results_dir,
        write_results,
    )

    if args.list:
        return _list()
    log = (lambda m: print(m, file=sys.stderr)) if args.json else print
    _check_counts(args)
    if args.tp != 1:
        return _run_tp(args)
    check_threads(args.threads)
    check_device(args.device)
    from attnlab.quant.store import is_quantized_dir

    if args.config and is_quantized_dir(args.config):
        from attnlab.commands._bench_quantized import run_quantized

        return run_quantized(args)
    if args.targets:
        if args.config or args.preset or args.overrides:
            raise UserError("--targets measures its own fixed config; drop the config and --set")
        from attnlab.bench.targets import run_targets

        if args.out:
            claim_results(args.out, force=args.force)  # before minutes of timing
        result = run_targets(log=log, threads=args.threads or 2)
        stem = args.out or results_dir() / result.machine.slug()
        title, flag = "attnlab bench --targets (CPU)", "--out" if args.out else "--targets"
    else:
        from attnlab.bench.runner import run_bench
        from attnlab.runs.preflight import check_training

        spec = _spec(args)
        if args.out:
            claim_results(args.out, force=args.force)  # before minutes of timing
        from attnlab.bench.variants import variant_config
        from attnlab.testing.gate import model_parts, require_checked

        models = []
        for v in spec.variants:
            with contextlib.suppress(UserError):  # the bench reports variants that do not apply
                models.append(variant_config(spec.config, v).model)
        checked = require_checked(model_parts(models), skip=args.skip_check)
        if checked.get("skipped"):
            log("the conformance check of the plugin parts was skipped (--skip-check)")
        checked = spec.resolved()  # flags against the config, then memory
        check_training(
            checked.config,
            "attnlab bench",
            batch_size=checked.batch_size,
            seq_len=checked.seq_len,
            device=checked.device,
        )
        if "memory" in spec.sections:
            from attnlab.base.extras import require

            require(
                "bench",
                "psutil",
                what="the memory section of attnlab bench (or pass --sections training,inference)",
            )
        result = run_bench(spec, log=log)
        stem = args.out
        if stem is None and args.save:
            cfg = "".join(c if c.isalnum() or c in "-_." else "-" for c in spec.config_name)
            stem = results_dir() / f"{result.machine.slug()}-{cfg[:60].strip('-')}"
        title, flag = f"attnlab bench {spec.config_name}", "--out" if args.out else "--save"
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, default=str))
    else:
        print_report(result)
    if stem is not None:
        for path in write_results(result, stem, title, force=args.force, flag=flag):
            log(f"wrote {path}")
    for line in failure_lines(result):  # the rest is measured and saved; the exit code is 1
        print(f"attnlab bench: {line}", file=sys.stderr)
    if result.failures or (result.targets and not all(t["met"] for t in result.targets)):
        return exitcodes.FAILED
    return exitcodes.OK


def _run_tp(args: argparse.Namespace) -> int:
    """``--tp N`` under torchrun: each variant's cached greedy decoding whole and split over N
    ranks, with the memory each rank holds (``attnlab.bench.tensor_parallel``); rank 0 prints."""
    import os

    import torch

    from attnlab.bench.runner import DTYPES
    from attnlab.bench.tensor_parallel import measure, table
    from attnlab.bench.variants import variant_config
    from attnlab.config import ConfigError
    from attnlab.model.tensor_parallel import check_tp
    from attnlab.runs.device import resolve_device, resolve_precision
    from attnlab.runs.distributed import check_tp_world, setup

    check_tp_world(args.tp, int(os.environ.get("WORLD_SIZE", "1")))
    if args.targets or args.out or args.save:
        raise UserError(
            "--tp prints decoding split over the ranks; --targets, --out and --save "
            "are for the single-process bench (drop them)"
        )
    spec = _spec(args)
    configs, skipped = [], []
    for name in spec.variants:
        try:
            cfg = variant_config(spec.config, name)
            check_tp(cfg.model, args.tp)
        except (ConfigError, UserError) as e:
            skipped.append(f"{name}: {' '.join(str(e).split())}")
            continue
        configs.append((name, cfg))
    if not configs:
        raise UserError("no variant can be split: " + "; ".join(skipped))
    dist = setup(args.device, args.tp)
    try:
        device = resolve_device(args.device, local_rank=dist.local_rank, setting="--device")
        if args.threads:
            torch.set_num_threads(args.threads)
        dtype_name = args.dtype or resolve_precision("auto", device).name  # as the trainer
        if dtype_name not in DTYPES:
            raise UserError(f"--dtype {dtype_name}: choose one of {', '.join(DTYPES)}")
        new = args.new_tokens or 32
        rows = [
            measure(
                n,
                c,
                dist,
                device,
                dtype=DTYPES[dtype_name],
                prompt_len=args.prompt_len,
                new_tokens=new,
                batch=args.decode_batch,
                repeats=args.decode_repeats,
            )
            for n, c in configs
        ]
    finally:
        dist.close()
    if dist.is_main:
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        machine = (
            f"{dist.world} processes on {device.type}, torch {torch.__version__}, "
            f"load average {load}"
        )
        if args.json:
            print(
                json.dumps(
                    {"machine": machine, "skipped": skipped, "rows": [r.to_dict() for r in rows]},
                    indent=2,
                )
            )
        else:
            print("\n".join([*table(rows, machine), *(f"skipped {s}" for s in skipped)]))
    return exitcodes.OK if all(r.greedy_identical for r in rows) else exitcodes.FAILED
