"""Peak training memory of virtual heads, materialised vs fused, as the context grows (issue 14).

    python benchmarks/vheads_memory.py [--tokens 4096] [--seq-lens 256,512,1024,2048]

At a fixed number of tokens per batch (B = tokens / T), one training step (forward, backward,
AdamW) of each subject at each T runs in a fresh Python process (``attnlab.bench.memory``): the
number is the process's RSS high-water mark (Linux ``VmHWM``, reset after the imports) minus the
RSS after the imports, i.e. model, gradients, AdamW state and the step's activations. With B * T
fixed, everything but attention's own memory is the same at every T, so a subject whose column
grows with T holds something that grows faster than O(T) per sequence ([B, H, T, T] maps grow
as tokens * T). Config: d=256, 2 layers, 8 heads, vocab 4096, float32, 2 threads.

Writes ``benchmarks/results/virtual-heads-memory-<cpu>-<date>.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

SUBJECTS: dict[str, list[str]] = {
    "baseline": [],
    "materialised (virtual_heads)": ["model.score.kind=virtual_heads"],
    "fused, per head, logits": ["model.score.kind=virtual_heads_fused", "model.score.mixing=none"],
    "fused, full, logits": ["model.score.kind=virtual_heads_fused", "model.score.mixing=full"],
    "fused, per head, probs": [
        "model.score.kind=virtual_heads_fused",
        "model.score.mixing=none",
        "model.score.on=probs",
    ],
    "fused, full, probs": [
        "model.score.kind=virtual_heads_fused",
        "model.score.mixing=full",
        "model.score.on=probs",
    ],
}
BASE = [
    "model.d_model=256",
    "model.n_layers=2",
    "model.attention.n_heads=8",
    "model.vocab_size=4096",
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=4096, help="tokens per batch (B * T)")
    p.add_argument("--seq-lens", default="256,512,1024,2048")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--out", metavar="STEM", help="default benchmarks/results/virtual-heads-memory-…"
    )
    args = p.parse_args(argv)

    import torch

    from attnlab.bench.machine import machine_info
    from attnlab.bench.memory import measure_memory
    from attnlab.bench.report import results_dir
    from attnlab.config import load_config

    seq_lens = [int(t) for t in args.seq_lens.split(",")]
    load0 = os.getloadavg()
    rows: dict[str, dict[int, float | None]] = {}
    errors: list[str] = []
    for name, flags in SUBJECTS.items():
        rows[name] = {}
        for T in seq_lens:
            cfg = load_config(
                "tiny", [*BASE, f"model.max_seq_len={T}", f"data.seq_len={T}", *flags]
            )
            r = measure_memory(
                "baseline",  # the variant without overrides: the config above is the subject
                cfg.to_dict(),
                seq_len=T,
                batch_size=args.tokens // T,
                device="cpu",
                dtype="float32",
                threads=args.threads,
                steps=1,
            )
            rows[name][T] = r.growth_mib
            if r.error:
                errors.append(f"{name} at T={T}: {r.error}")
            print(
                f"{name:32s} T={T:5d} B={args.tokens // T:3d} growth {r.growth_mib} MiB", flush=True
            )
    torch.set_num_threads(args.threads)
    machine = machine_info("cpu", torch.float32, False)
    stem = args.out or str(results_dir() / f"virtual-heads-memory-{machine.slug()}")
    result = {
        "what": "peak RSS growth of one training step (MiB), fresh process per point",
        "tokens_per_batch": args.tokens,
        "config": BASE,
        "threads": args.threads,
        "machine": machine.to_dict(),
        "load_average_start": load0,
        "load_average_end": os.getloadavg(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "growth_mib": rows,
        "errors": errors,
    }
    with open(f"{stem}.json", "w") as f:
        json.dump(result, f, indent=2)
    with open(f"{stem}.md", "w") as f:
        f.write(_markdown(result, seq_lens))
    print(f"wrote {stem}.md and {stem}.json")
    return 1 if errors else 0


def _markdown(r: dict, seq_lens: list[int]) -> str:
    rows = r["growth_mib"]
    head = "| subject | " + " | ".join(f"T={T} (B={r['tokens_per_batch'] // T})" for T in seq_lens)
    head += f" | growth {seq_lens[0]} -> {seq_lens[-1]} |\n"
    lines = [head, "|---" * (len(seq_lens) + 2) + "|\n"]
    for name, by_t in rows.items():
        vals = [by_t.get(T) for T in seq_lens]
        cells = [f"{v:,.0f}" if v is not None else "failed" for v in vals]
        grow = f"{vals[-1] - vals[0]:+,.0f}" if None not in (vals[0], vals[-1]) else "-"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {grow} |\n")
    m = r["machine"]
    return (
        "# Virtual heads: peak training memory, materialised vs fused\n\n"
        f"Peak RSS growth (MiB) of one training step (forward, backward, AdamW) at "
        f"{r['tokens_per_batch']} tokens per batch, each point in a fresh process "
        "(`attnlab.bench.memory`: VmHWM after the imports minus RSS after the imports). "
        f"Config: {' '.join(r['config'])}, float32, {r['threads']} threads. Produced by "
        "`python benchmarks/vheads_memory.py`.\n\n"
        + "".join(lines)
        + f"\nMachine: {m['device_name']}, {m['cpu_count']} CPUs, torch {m['torch_version']}; "
        f"{r['date']}; load "
        f"average (1/5/15 min) {', '.join(f'{x:.2f}' for x in r['load_average_start'])} at "
        f"start, {', '.join(f'{x:.2f}' for x in r['load_average_end'])} at end.\n"
        + ("".join(f"\nerror: {e}" for e in r["errors"]) + "\n" if r["errors"] else "")
    )


if __name__ == "__main__":
    sys.exit(main())
