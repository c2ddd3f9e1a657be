"""``attnlab bench QDIR``: the quantized directory's decode speed and memory against its source
(attnlab.quant.bench); the flags that apply: --prompt-len, --new-tokens, --decode-repeats (timed
rounds), --warmup, --threads, --sections (memory or not), --json."""

from __future__ import annotations

import argparse
import json
import os

from attnlab.base import exitcodes
from attnlab.base.errors import UserError

#: flags of the variant bench that say nothing about a quantized directory (dest -> flag)
_NOT_HERE = {
    "preset": "--preset",
    "overrides": "--" + "set",  # named, not defined here (commands/_common.py defines it)
    "extra_variants": "--variant",
    "out": "--out",
    "save": "--save",
    "targets": "--targets",
    "compile": "--compile",
}


def run_quantized(args: argparse.Namespace) -> int:
    import torch

    from attnlab.quant.bench import bench_quantized

    given = [flag for dest, flag in _NOT_HERE.items() if getattr(args, dest, None)]
    if given:
        raise UserError(
            f"{args.config} is a quantized directory: attnlab bench times its decoding against "
            f"its source run; {', '.join(given)} apply to variant benches only (drop them)"
        )
    if args.threads:
        torch.set_num_threads(args.threads)
    new_tokens = args.new_tokens or 32
    rows, note = bench_quantized(
        args.config,
        prompt_len=args.prompt_len,
        new_tokens=new_tokens,
        repeats=args.decode_repeats,
        warmup=args.warmup,
        memory="memory" in args.sections.split(","),
    )
    if args.json:
        print(json.dumps({"target": args.config, "rows": [r.to_dict() for r in rows]}, indent=2))
        return exitcodes.OK
    print(
        f"{args.config}: greedy decoding with the KV cache, {new_tokens} tokens after "
        f"{args.prompt_len}, {args.decode_repeats} interleaved rounds, {torch.get_num_threads()} "
        f"threads; load average {os.getloadavg()[0]:.2f}"
    )
    if note:
        print(f"  ({note})")
    print(
        f"  {'model':<14} {'tok/s':>9} {'best':>9} {'speedup':>8} {'weights MiB':>12} {'peak MiB':>9}"
    )
    for r in rows:
        peak = f"{r.peak_decode_mib:.0f}" if r.peak_decode_mib is not None else "-"
        print(
            f"  {r.name:<14} {r.decode_tokens_per_s:>9.1f} {r.decode_tokens_per_s_best:>9.1f} "
            f"{r.speedup:>7.2f}x {r.weight_bytes / 2**20:>12.2f} {peak:>9}"
        )
    return exitcodes.OK
