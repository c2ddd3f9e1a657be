"""Check issue 14's CPU speed targets for the identity head and MoE values in one interleaved run.

    python benchmarks/seed004_targets.py [--repeats 15] [--steps 1] [--wait-quiet 1.5] [--out STEM]

Config: the CPU target shape of ``attnlab bench --targets`` (``tiny`` at d=256, 6 layers, 8 heads,
vocab 4096, T=256, batch 8, float32, 2 threads); subjects: ``baseline``, ``identity_head`` (its
full ladder rung: identity head + no residual + no MLP + nonlinear mixer), ``moe_values`` (one
layer looped 6 times, top-2 of 8 experts, ``impl = auto``) and ``moe_values_loop`` (the same with
``impl = loop``), timed in the same interleaved rounds. Targets, from the same run:

1. identity head step time <= (its FLOP ratio + 0.05) x the baseline's;
2. MoE values MFU >= 0.85 x the baseline's MFU (within 15%; MFU counts only the active experts),
   i.e. its FLOP ratio / its paired time ratio >= 0.85.

The same command is ``attnlab bench tiny --set <the target overrides> --variants
baseline,identity_head,moe_values --variant moe_values_loop:...,value.impl=loop --peers none
--sections training --threads 2``. Writes ``benchmarks/results/<STEM>.md`` and ``.json`` (default
``cpu-<cpu>-<date>-seed004``) and exits 1 when a target is missed. Runs against whatever attnlab is
imported, so ``PYTHONPATH=<an older tree>/src`` measures that code with the same subjects.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

TARGET_VARIANTS = ["baseline", "identity_head", "moe_values"]
LOOP_VARIANT = "moe_values_loop:n_layers=1,mlp=false,value.kind=moe,loops=6,value.impl=loop"
MFU_SHARE = 0.85
TIME_SLACK = 0.05


def evaluate(result) -> list[dict]:
    """The two target checks of issue 14 (a missing row counts as not met)."""
    out = []
    base, ih, moe = (result.row("training", n) for n in ("baseline", "identity_head", "moe_values"))
    if base and ih:
        limit = ih.flop_ratio + TIME_SLACK
        out.append(
            {
                "target": "identity head (full rung) step time vs baseline",
                "measured": f"{ih.time_ratio:.3f}x (best rounds {ih.time_ratio_best:.3f}x)",
                "required": f"<= {limit:.3f}x (FLOP ratio {ih.flop_ratio:.3f} + {TIME_SLACK})",
                "met": bool(ih.time_ratio <= limit),
            }
        )
    if base and moe:
        # MFU_moe / MFU_base = FLOP ratio / time ratio; judged, like the time targets, on the
        # paired median time ratio (the MFU column divides each subject's own median)
        share = moe.flop_ratio / moe.time_ratio
        best = moe.flop_ratio / moe.time_ratio_best
        table = moe.mfu_measured / base.mfu_measured
        out.append(
            {
                "target": "MoE values MFU vs baseline MFU",
                "measured": f"{share:.3f} (paired; best rounds {best:.3f}; MFU column "
                f"{100 * moe.mfu_measured:.1f}% vs {100 * base.mfu_measured:.1f}% = {table:.3f})",
                "required": f">= {MFU_SHARE:.2f}",
                "met": bool(share >= MFU_SHARE),
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=15, help="interleaved timed rounds")
    p.add_argument("--steps", type=int, default=1, help="timed steps per subject per round")
    p.add_argument("--wait-quiet", type=float, metavar="LOAD", help="wait for load average < LOAD")
    p.add_argument("--max-wait", type=float, default=1200.0, metavar="S")
    p.add_argument(
        "--out", metavar="STEM", help="default benchmarks/results/cpu-<cpu>-<date>-seed004"
    )
    p.add_argument(
        "--force", action="store_true", help="replace an earlier unedited result of attnlab's"
    )
    args = p.parse_args(argv)

    sys.path.insert(0, str(Path(__file__).parent))
    from cpu_targets import wait_for_quiet

    from attnlab.bench.report import print_report, results_dir, write_results
    from attnlab.bench.runner import BenchSpec, run_bench
    from attnlab.bench.targets import TARGET_OVERRIDES, TARGET_PRESET
    from attnlab.bench.variants import add_variant
    from attnlab.config import load_config

    if args.wait_quiet is not None:
        wait_for_quiet(args.wait_quiet, args.max_wait)
    spec = BenchSpec(
        config=load_config(TARGET_PRESET, TARGET_OVERRIDES),
        config_name=f"{TARGET_PRESET} + {' '.join(TARGET_OVERRIDES)}",
        variants=[*TARGET_VARIANTS, add_variant(LOOP_VARIANT)],
        peers=[],
        steps=args.steps,
        warmup=1,
        repeats=args.repeats,
        threads=args.threads,
        device="cpu",
        dtype="float32",
        sections=("training",),
    )
    result = run_bench(spec)
    result.targets = evaluate(result)
    print_report(result)
    stem = args.out or results_dir() / f"{result.machine.slug()}-seed004"
    for path in write_results(
        result, stem, "attnlab issue 14 targets (identity head, MoE values)", force=args.force
    ):
        print(f"wrote {path}")
    return 0 if all(t["met"] for t in result.targets) else 1


if __name__ == "__main__":
    sys.exit(main())
