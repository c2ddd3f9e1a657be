"""``attnlab quantize RUN --scheme SCHEME --out DIR``: a quantized copy of a trained decoder."""

from __future__ import annotations

import argparse

from attnlab.base import exitcodes

NAME = "quantize"
HELP = "quantize a run's decoder with torchao (int8/int4 weights, int8 dynamic activations)"

EPILOG = """\
schemes:
  int8-weight    int8 weights, one scale per output row (activations stay float)
  int4-weight    int4 weights, a scale and zero per --group-size inputs (32, 64, 128; default 128)
  int8-dynamic   int8 weights and int8 activations per token, quantized at run time

The parts decide what is quantized (each part's quantizable(): its Linears of >= 32 inputs and
outputs by default); norms, embeddings, a tied LM head, small gates and routers and every part's
own tensors stay in full precision, listed with the reason in DIR/quantized.json.

DIR is a target like a run: attnlab eval DIR, generate DIR, inspect DIR, bench DIR, export DIR.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from attnlab.quant.schemes import SCHEMES

    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = EPILOG
    p.add_argument("source", metavar="RUN", help="a run dir or RUN/checkpoints/step_N")
    p.add_argument("--scheme", required=True, choices=list(SCHEMES), help="what to quantize to")
    p.add_argument(
        "--group-size", type=int, metavar="G", help="int4-weight: inputs per scale (default 128)"
    )
    p.add_argument("--out", required=True, metavar="DIR", help="the directory to write")
    p.add_argument("--force", action="store_true", help="replace an earlier quantized --out")
    p.add_argument(
        "--tied-head",
        action="store_true",
        help="quantize an LM head tied to the token embedding as its own copy (lookups stay float)",
    )


def run(args: argparse.Namespace) -> int:
    from attnlab.quant.run import quantize_run

    rec = quantize_run(
        args.source,
        args.scheme,
        args.out,
        group_size=args.group_size,
        force=args.force,
        tied_head=args.tied_head,
    )
    group = f", group size {rec['group_size']}" if rec["group_size"] else ""
    size, full = rec["size_on_disk_bytes"], rec["full_precision_bytes"]
    print(
        f"quantized {rec['source_arg']} (step {rec['step']}) to {args.out}: {args.scheme}{group}, "
        f"torchao {rec['torchao']}"
    )
    print(
        f"  quantized {len(rec['quantized'])} Linears; {size:,} bytes on disk ({size / full:.2f}x "
        f"the {full:,} bytes in float32)"
    )
    print(
        f"  logits moved by {rec['logits_rel_rms_error']:.4f} (relative RMS, random tokens); "
        f"the scheme's tolerance per part is {rec['tolerance']}"
    )
    reasons: dict[str, int] = {}
    for row in rec["kept"]:
        reasons[row["reason"]] = reasons.get(row["reason"], 0) + 1
    print(f"  kept in full precision ({len(rec['kept'])} tensors, names in quantized.json):")
    for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        print(f"    {n:>4} x {reason}")
    if rec["stored_in_float_requantized_at_load"]:
        print(
            "  int4 weights are stored in float and quantized again at load (no torchao "
            "safetensors form for the CPU int4 tensor)"
        )
    return exitcodes.OK
