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
#: a scheme name ending so (``int8-weight+head``) quantizes the tied LM head too (``tied_head``)
HEAD = "+head"


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


def read_bandwidth_gbs(mib: int = 512, rounds: int = 5) -> tuple[float, float]:
    """Streaming-read bandwidth, (best, median) over ``rounds``: bytes / seconds of ``x.sum()``
    over a ``mib`` MiB float32 tensor (what decoding does to its weights: read each once), on
    the threads torch is set to."""
    x = torch.ones(mib * 2**18)
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        x.sum()
        times.append(time.perf_counter() - t)
    times.sort()
    return x.numel() * 4 / times[0] / 1e9, x.numel() * 4 / times[len(times) // 2] / 1e9


def build(args: argparse.Namespace, work: Path):
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
    if args.no_unfused:
        del models["float32-unfused"]
    for name in args.schemes.split(","):
        scheme_name, head = name.removesuffix(HEAD), name.endswith(HEAD)
        scheme = get_scheme(scheme_name)
        q = copy.deepcopy(unfused)
        size = args.group_size if scheme.default_group_size else None
        quantize_model(q, scheme, size, tied_head=head)
        info = {"scheme": scheme_name, "group_size": size, "tied_head": head}
        rec = save(work / name, q, cfg, info, full_precision=unfused)
        models[name] = q
        dirs[name] = (work / name, rec["size_on_disk_bytes"])
        kernels[name] = scheme.kernel + (
            "; the tied LM head as its own int8 copy" if head else "; the tied LM head float32"
        )
        if scheme_name == "int8-weight" and not args.no_eager and EAGER not in models:
            models[EAGER], dirs[EAGER] = q, dirs[name]  # the same model, torchao's own kernel
            kernels[EAGER] = (
                f"aten.mm on the int8 weight cast to float32 (torchao's eager path; {name})"
            )
    return cfg, models, dirs, kernels


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="gpt2-124m")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument(
        "--schemes",
        default="int8-weight,int4-weight,int8-dynamic",
        help=f"comma-separated; a name ending {HEAD!r} quantizes the tied LM head too",
    )
    p.add_argument("--group-size", type=int, default=128)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-memory", action="store_true")
    p.add_argument("--no-eager", action="store_true", help=f"leave out the {EAGER} row")
    p.add_argument("--no-unfused", action="store_true", help="leave out float32-unfused")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first (compiles)")
    p.add_argument("--out", metavar="STEM")
    args = p.parse_args(argv)
    args.command = "python benchmarks/quantization.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    return args


def memory(rows: list, dirs: dict, args: argparse.Namespace) -> None:
    """Each row's resident and peak decode memory, a fresh process per model."""
    from attnlab.quant.speed import measure_memory

    for row in rows:
        spec = {"prompt_len": args.prompt_len, "new_tokens": args.new_tokens}
        spec["threads"] = args.threads
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


def measure(args: argparse.Namespace, work: Path) -> dict:
    from attnlab.quant.speed import decode_speeds

    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()
    _, models, dirs, kernels = build(args, work)
    bw = bandwidth_gbs()
    read_bw = read_bandwidth_gbs()
    rows = decode_speeds(
        models,
        prompt_len=args.prompt_len,
        new_tokens=args.new_tokens,
        repeats=args.repeats,
        warmup=args.warmup,
        plain=frozenset({EAGER}),
    )
    read_bw_end = read_bandwidth_gbs()
    if not args.no_memory:
        memory(rows, dirs, args)
    return {
        "preset": args.preset,
        "overrides": args.set,
        "params": sum(p.numel() for p in models["float32"].parameters()),
        "threads": args.threads,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "group_size": args.group_size,
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "copy_bandwidth_gbs": bw,
        "read_bandwidth_gbs": {"start": read_bw, "end": read_bw_end},
        "command": args.command,
        "loadavg_start": load_start,
        "loadavg_end": os.getloadavg(),
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


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    with tempfile.TemporaryDirectory(prefix="attnlab-quant-bench-") as work:
        result = measure(args, Path(work))
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
    rb = r.get("read_bandwidth_gbs") or {}
    start, end = rb.get("start") or (float("nan"),) * 2, rb.get("end") or (float("nan"),) * 2
    lines = [
        f"# Quantized decoding on CPU: {r['preset']} ({r['params'] / 1e6:.1f}M parameters)",
        "",
        f"`{r.get('command', '')}`",
        "",
        f"torch {r['torch']}, {r['threads']} threads, greedy decode with the KV cache of "
        f"{r['new_tokens']} tokens after {r['prompt_len']}, {r['repeats']} interleaved rounds; "
        f"load average {r['loadavg_start'][0]:.2f} at start, {r['loadavg_end'][0]:.2f} at end; "
        f"copy bandwidth {r['copy_bandwidth_gbs']:.1f} GB/s (read + write, best of 5); "
        f"streaming read {start[0]:.1f} GB/s best, {start[1]:.1f} median before the decodes, "
        f"{end[0]:.1f} / {end[1]:.1f} after ({r['threads']} threads, sum over 512 MiB).",
        "",
        "| model | decode tok/s (median) | best | speedup (ratio of medians) | per-round speedup "
        "median [min, max] | weight MiB | weights read GB/s | bandwidth bound tok/s "
        "| size on disk MiB | RSS runtime MiB | RSS loaded MiB | peak decode MiB | kernel |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    best_read = max(start[0], end[0])

    def num(v: float | None, fmt: str = ".0f") -> str:
        return "" if v is None else format(v, fmt)

    for row in r["rows"]:
        disk = f"{row['size_on_disk_bytes'] / 2**20:.1f}" if row["size_on_disk_bytes"] else ""
        paired = (
            f"{row['speedup_paired']:.2f}x [{row['speedup_low']:.2f}, {row['speedup_high']:.2f}]"
            if row.get("speedup_paired") is not None
            else ""
        )
        bound = best_read * 1e9 / row["weight_bytes"]
        lines.append(
            f"| {row['name']} | {row['decode_tokens_per_s']:.2f} | "
            f"{row['decode_tokens_per_s_best']:.2f} | {row['speedup']:.2f}x | {paired} "
            f"| {row['weight_bytes'] / 2**20:.0f} | {row['weight_read_gbs']:.2f} | {bound:.1f} "
            f"| {disk} | {num(row['rss_runtime_mib'])} | {num(row['rss_loaded_mib'])} "
            f"| {num(row['peak_decode_mib'])} | {row['kernel']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
