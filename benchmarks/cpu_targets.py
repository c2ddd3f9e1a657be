"""Check the CPU speed targets of issue 7 in one interleaved run and record the result.

    python benchmarks/cpu_targets.py [--threads 2] [--wait-quiet 1.5] [--max-wait 1200]

Config: GPT-2 shape d=256, 6 layers, 8 heads, vocab 4096, T=256, batch 8, float32, 2 threads.
Targets (ratios from the same run): attnlab baseline tokens/s >= 1.00x nanoGPT's model; nonlinear
query (fused) step time <= 1.05x baseline; pre-projection + skip <= its FLOP ratio + 0.05; KV-cache
decoding of 256 new tokens >= 5x faster than recomputation with identical greedy tokens.

Writes ``benchmarks/results/cpu-<cpu-model>-<date>.md`` and ``.json`` (same as
``attnlab bench --targets``) and exits 1 when a target is missed. On a shared machine, pass
``--wait-quiet`` to start only once the 1-minute load average is below that value (polled every
60 s, up to ``--max-wait`` seconds; the load at start and end is recorded either way).
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def wait_for_quiet(threshold: float, max_wait: float) -> None:
    deadline = time.monotonic() + max_wait
    while True:
        load1 = os.getloadavg()[0]
        if load1 < threshold:
            print(f"load average {load1:.2f} < {threshold}: starting", flush=True)
            return
        if time.monotonic() >= deadline:
            print(f"load average still {load1:.2f} after {max_wait:.0f} s: running anyway")
            return
        print(f"load average {load1:.2f} >= {threshold}; waiting 60 s", flush=True)
        time.sleep(60)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=11, help="interleaved timed rounds")
    p.add_argument("--steps", type=int, default=1, help="timed steps per subject per round")
    p.add_argument("--no-context-peers", action="store_true", help="time only nanoGPT as peer")
    p.add_argument("--wait-quiet", type=float, metavar="LOAD", help="wait for load average < LOAD")
    p.add_argument("--max-wait", type=float, default=1200.0, metavar="S")
    p.add_argument("--out", metavar="FILE", help="default benchmarks/results/cpu-<cpu>-<date>")
    p.add_argument(
        "--force", action="store_true", help="replace an earlier unedited result of attnlab's"
    )
    args = p.parse_args(argv)

    from attnlab.bench.report import print_report, results_dir, write_results
    from attnlab.bench.targets import run_targets

    if args.wait_quiet is not None:
        wait_for_quiet(args.wait_quiet, args.max_wait)
    result = run_targets(
        threads=args.threads,
        repeats=args.repeats,
        steps=args.steps,
        context_peers=not args.no_context_peers,
    )
    print_report(result)
    stem = args.out or results_dir() / result.machine.slug()
    for path in write_results(result, stem, "attnlab CPU targets", force=args.force):
        print(f"wrote {path}")
    return 0 if all(t["met"] for t in result.targets) else 1


if __name__ == "__main__":
    sys.exit(main())
