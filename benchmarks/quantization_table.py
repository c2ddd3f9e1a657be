"""The per-variant quantization table of issue 35 (docs/results/quantization/).

    python benchmarks/quantization_table.py --data DATA_DIR --preset tiny --steps 200
    python benchmarks/quantization_table.py --data DATA_DIR --preset tiny --steps 2 --smoke

For each variant (baseline, nonlinear query, pre-projection + content skip, identity head, MoE
values, fused virtual heads: ``attnlab.bench.variants``), trained to the same budget
(``--steps`` of the preset's recipe on ``--data``, one seed), and for float32 and every scheme:
size on disk (the run's checkpoint weights / the quantized directory's ``model.safetensors``),
validation perplexity (``attnlab eval`` ``perplexity:DATA``, ``--limit`` windows) and its change
from float32, decode tokens/s with the KV cache (float32 and the schemes of one variant timed in
interleaved rounds, ``attnlab.quant.speed``) and peak decode memory (a fresh process per model).

Writes ``--out`` (default ``docs/results/quantization/table``) ``.md`` and ``.json``; the runs
and quantized directories go under ``--work``. Runs ``attnlab train`` and ``attnlab quantize``
as a user would.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

VARIANTS = [
    "baseline",
    "nonlinear_query",
    "preproj_skip",
    "identity_head",
    "moe_values",
    "virtual_heads_fused",
]
SCHEMES = ["int8-weight", "int4-weight", "int8-dynamic"]


def attnlab(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "attnlab", *args], check=True)


def train(variant: str, args: argparse.Namespace, work: Path) -> Path:
    from attnlab.bench.variants import find_variant
    from attnlab.config import load_config

    v = find_variant(variant)
    assert v is not None, variant
    run = work / variant
    sets = [f"model.{o}" for o in v.resolved_overrides(load_config(args.preset))]
    sets += [
        f"data.dir={args.data}",
        f"train.max_steps={args.steps}",
        f"train.warmup_steps={max(1, args.steps // 10)}",
        f"train.batch_size={args.batch_size}",
        f"train.checkpoint_every={args.steps}",
        "train.device=cpu",
    ]
    done = [c for c in (run / "checkpoints").glob("step_*") if int(c.name[5:]) == args.steps]
    if done:
        return run  # trained to this budget by an earlier, interrupted invocation
    attnlab("train", args.preset, "--out", str(run), *[a for s in sets for a in ("--set", s)])
    return run


def perplexity(target: Path, args: argparse.Namespace) -> float:
    import attnlab.quant.target  # noqa: F401
    from attnlab.eval import evaluate

    source = args.val or args.data
    res = evaluate(str(target), [f"perplexity:{source}"], args.limit, save=False)
    (entry,) = res.values()
    return float(entry["metrics"]["perplexity"])


def variant_rows(variant: str, args: argparse.Namespace, work: Path) -> list[dict]:
    from attnlab.quant.run import quantize_run
    from attnlab.quant.speed import decode_speeds, measure_memory
    from attnlab.quant.store import load
    from attnlab.runs.load import load_run_model

    run = train(variant, args, work)
    models, sizes, ppl, targets = {}, {}, {}, {}
    models["float32"] = load_run_model(run)[0]
    sizes["float32"] = sum(
        p.stat().st_size for p in (run / "checkpoints").rglob("model.safetensors")
    )
    ppl["float32"], targets["float32"] = perplexity(run, args), None
    for scheme in SCHEMES:
        qdir = work / f"{variant}-{scheme}"
        size = args.group_size if scheme == "int4-weight" else None
        quantize_run(run, scheme, qdir, group_size=size, force=True)  # what attnlab quantize runs
        models[scheme] = load(qdir).model
        sizes[scheme] = (qdir / "model.safetensors").stat().st_size
        ppl[scheme], targets[scheme] = perplexity(qdir, args), qdir
    speeds = decode_speeds(models, new_tokens=args.new_tokens, repeats=args.repeats)
    rows = []
    for s in speeds:
        spec = {"prompt_len": 16, "new_tokens": args.new_tokens}
        if targets[s.name] is not None:
            spec["quantized"] = str(targets[s.name])
        else:
            spec["run"] = str(run)
        mem = measure_memory(spec) if args.memory else None
        rows.append(
            {
                "variant": variant,
                "model": s.name,
                "size_on_disk_bytes": sizes[s.name],
                "val_ppl": ppl[s.name],
                "ppl_change_pct": 100 * (ppl[s.name] / ppl["float32"] - 1),
                "decode_tokens_per_s": s.decode_tokens_per_s,
                "speedup": s.speedup,
                "weight_bytes": s.weight_bytes,
                "peak_decode_mib": mem["peak_decode_mib"] if mem else None,
            }
        )
    return rows


def render(rows: list[dict], args: argparse.Namespace) -> str:
    import platform

    import torch

    out = [
        f"# Quantized variants: {args.preset}, {args.steps} steps of batch {args.batch_size} "
        f"on {args.data}",
        "",
        f"`{args.command}`",
        "",
        f"{datetime.date.today().isoformat()}, {platform.processor() or platform.machine()}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; load average "
        f"{args.load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end; decode: "
        f"{args.new_tokens} tokens, "
        f"{args.repeats} interleaved rounds (float32 and the schemes of each variant together)."
        + (" SMOKE RUN: not a result." if args.smoke else ""),
        "",
        "| variant | model | size on disk KiB | weights in memory KiB | val ppl | change | "
        "decode tok/s | speedup | peak MiB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        peak = f"{r['peak_decode_mib']:.0f}" if r["peak_decode_mib"] else ""
        out.append(
            f"| {r['variant']} | {r['model']} | {r['size_on_disk_bytes'] / 1024:.0f} | "
            f"{r['weight_bytes'] / 1024:.0f} | "
            f"{r['val_ppl']:.3f} | {r['ppl_change_pct']:+.2f}% | {r['decode_tokens_per_s']:.1f} | "
            f"{r['speedup']:.2f}x | {peak} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="a prepared data directory")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=16, help="train.batch_size")
    p.add_argument(
        "--val",
        metavar="FILE",
        help="score perplexity on this .txt/.jsonl instead of --data's validation split",
    )
    p.add_argument("--limit", type=int, default=20, help="validation windows for perplexity")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--group-size", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--work", default="runs/quantization-table")
    p.add_argument("--out", default="docs/results/quantization/table")
    p.add_argument("--smoke", action="store_true", help="mark the table as a smoke run")
    p.add_argument("--resume", action="store_true", help="keep the variants --out already has")
    p.add_argument(
        "--memory", action="store_true", help="peak decode RSS, a fresh process per model (slow)"
    )
    args = p.parse_args(argv)
    args.command = "python benchmarks/quantization_table.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    args.load_start = os.getloadavg()[0]
    work = Path(args.work)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = json.loads(out.with_suffix(".json").read_text())["rows"] if args.resume else []
    rows = list(done)
    for v in args.variants.split(","):
        if any(r["variant"] == v for r in done):
            continue  # --resume: measured by an earlier, interrupted invocation
        rows += variant_rows(v, args, work)
        text = render(rows, args)  # after each variant: an interruption keeps what was measured
        out.with_suffix(".md").write_text(text + "\n")
        out.with_suffix(".json").write_text(
            json.dumps({"args": vars(args), "rows": rows}, indent=1)
        )
    print(render(rows, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
