"""Decode speed and memory of a model in float32 and quantized by every scheme (issue 35), on CPU.

    python benchmarks/quantization.py                    # gpt2-124m's shape, random weights
    python benchmarks/quantization.py --preset tiny --new-tokens 8 --repeats 2   # a smoke run

Speed does not depend on the weights' values, so the model is randomly initialised (seed 0).
Rows: ``float32`` (the preset as configured: fused Q/K/V, attnlab's decode layout),
``float32-unfused`` (what the quantized models run: Q, K, V as three Linears), one row per
scheme, and ``int8-weight-torchao-eager``: the int8-weight model decoded by torchao's own eager
kernel instead of attnlab's int8 decode kernel (attnlab.quant.decode_kernel). Decode tokens/s: greedy with the KV cache after a ``--prompt-len`` prompt, all models
timed in each round, rounds interleaved, median (and best) over rounds; ``speedup`` is against
``float32``. Memory: a fresh process per model (RSS after loading, peak RSS of one cached decode;
quantized models load from the directory ``attnlab quantize`` would write). Also measured: the
machine's copy bandwidth (a 512 MiB tensor copy, GB/s read + write) and, per row, the bytes of
weights each decoded token reads, so ``weight bytes x tokens/s`` says how much of that
bandwidth decoding uses. The load average is recorded before and after.

Writes ``--out`` (default ``benchmarks/results/quant-<cpu>-<date>``) ``.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

#: int8-weight decoded by torchao's own eager kernel (no decode layout), for comparison
EAGER = "int8-weight-torchao-eager"


def bandwidth_gbs(mib: int = 512, rounds: int = 5) -> float:
    """Best-of-``rounds`` copy bandwidth: (read + write bytes) / seconds of ``dst.copy_(src)``."""
    src = torch.ones(mib * 2**18)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t)
    return 2 * src.numel() * 4 / best / 1e9


def build(args: argparse.Namespace):
    from attnlab.config import load_config
    from attnlab.model import build_model
    from attnlab.quant import get_scheme, quantizable_config, quantize_model
    from attnlab.quant.store import save

    cfg = load_config(args.preset, args.set)
    torch.manual_seed(0)
    fused = build_model(cfg.model).eval()
    qcfg = quantizable_config(cfg)
    unfused = build_model(qcfg.model).eval()
    unfused.load_state_dict(fused.state_dict())
    models = {"float32": fused, "float32-unfused": unfused}
    dirs, kernels = {}, {"float32": "aten.mm / attnlab decode layout (float32)"}
    work = Path(tempfile.mkdtemp(prefix="attnlab-quant-bench-"))
    for name in args.schemes.split(","):
        scheme = get_scheme(name)
        q = copy.deepcopy(unfused)
        quantize_model(q, scheme, args.group_size if scheme.default_group_size else None)
        info = {
            "scheme": name,
            "group_size": args.group_size if scheme.default_group_size else None,
        }
        rec = save(work / name, q, cfg, info, full_precision=unfused)
        models[name] = q
        dirs[name] = (work / name, rec["size_on_disk_bytes"])
        kernels[name] = scheme.kernel
        if name == "int8-weight":  # the same model without attnlab's decode kernel
            models[EAGER], dirs[EAGER] = q, dirs[name]
            kernels[EAGER] = "aten.mm on the int8 weight cast to float32 (torchao's eager path)"
    return cfg, models, dirs, kernels


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="gpt2-124m")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--schemes", default="int8-weight,int4-weight,int8-dynamic")
    p.add_argument("--group-size", type=int, default=128)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-memory", action="store_true")
    p.add_argument("--out", metavar="STEM")
    args = p.parse_args(argv)
    from attnlab.quant.speed import decode_speeds, measure_memory

    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()
    _, models, dirs, kernels = build(args)
    bw = bandwidth_gbs()
    rows = decode_speeds(
        models,
        prompt_len=args.prompt_len,
        new_tokens=args.new_tokens,
        repeats=args.repeats,
        plain=frozenset({EAGER}),
    )
    for row in rows:
        if args.no_memory:
            break
        spec = {
            "prompt_len": args.prompt_len,
            "new_tokens": args.new_tokens,
            "threads": args.threads,
        }
        if row.name in dirs:
            spec["quantized"] = str(dirs[row.name][0])
            spec["plain"] = row.name == EAGER
        else:
            overrides = list(args.set) + (
                ["model.attention.fuse_qkv=false"] if "unfused" in row.name else []
            )
            spec.update(preset=args.preset, overrides=overrides)
        mem = measure_memory(spec)
        row.rss_runtime_mib = mem["rss_runtime_mib"]
        row.rss_loaded_mib, row.peak_decode_mib = mem["rss_loaded_mib"], mem["peak_decode_mib"]
    load_end = os.getloadavg()
    result = {
        "preset": args.preset,
        "overrides": args.set,
        "params": sum(p.numel() for p in models["float32"].parameters()),
        "threads": args.threads,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "group_size": args.group_size,
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "copy_bandwidth_gbs": bw,
        "loadavg_start": load_start,
        "loadavg_end": load_end,
        "date": datetime.date.today().isoformat(),
        "rows": [
            {
                **r.to_dict(),
                "kernel": kernels.get(r.name, kernels["float32"]),
                "size_on_disk_bytes": dirs[r.name][1] if r.name in dirs else None,
                "weight_read_gbs": r.weight_bytes * r.decode_tokens_per_s / 1e9,
            }
            for r in rows
        ],
    }
    text = render(result)
    print(text)
    stem = Path(args.out) if args.out else _default_stem(result)
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    stem.with_suffix(".md").write_text(text + "\n")
    print(f"wrote {stem}.md and .json", file=sys.stderr)
    return 0


def _default_stem(result: dict) -> Path:
    return Path(__file__).parent / "results" / f"quant-{result['preset']}-{result['date']}"


def render(r: dict) -> str:
    lines = [
        f"# Quantized decoding on CPU: {r['preset']} ({r['params'] / 1e6:.1f}M parameters)",
        "",
        f"torch {r['torch']}, {r['threads']} threads, greedy decode with the KV cache of "
        f"{r['new_tokens']} tokens after {r['prompt_len']}, {r['repeats']} interleaved rounds; "
        f"load average {r['loadavg_start'][0]:.2f} at start, {r['loadavg_end'][0]:.2f} at end; "
        f"copy bandwidth {r['copy_bandwidth_gbs']:.1f} GB/s (read + write, best of 5).",
        "",
        "| model | decode tok/s (median) | best | speedup vs float32 | weight MiB | weights read GB/s "
        "| size on disk MiB | RSS runtime MiB | RSS loaded MiB | peak decode MiB | kernel |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        disk = f"{row['size_on_disk_bytes'] / 2**20:.1f}" if row["size_on_disk_bytes"] else ""
        rss = f"{row['rss_loaded_mib']:.0f}" if row["rss_loaded_mib"] is not None else ""
        base = f"{row['rss_runtime_mib']:.0f}" if row["rss_runtime_mib"] is not None else ""
        peak = f"{row['peak_decode_mib']:.0f}" if row["peak_decode_mib"] is not None else ""
        lines.append(
            f"| {row['name']} | {row['decode_tokens_per_s']:.2f} | {row['decode_tokens_per_s_best']:.2f} "
            f"| {row['speedup']:.2f}x | {row['weight_bytes'] / 2**20:.0f} | {row['weight_read_gbs']:.2f} "
            f"| {disk} | {base} | {rss} | {peak} | {row['kernel']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
