"""Attention alone through the engine (issue 34): each mask, mod and normaliser against the causal
SDPA baseline and against today's dense form, forward + backward and forward only.

    python benchmarks/attention_engine.py [--lengths 1024,2048,8192] [--fwd-lengths 32768]
        [--batch 2] [--heads 8] [--head-dim 32] [--rounds 3] [--threads 1] [--memory]
        [--cases causal,alibi,...] [--budget-gib 3]

One process times every case at one length in interleaved rounds (A B C ... A B C ...; one
warm-up call each first); a cell is the median over rounds and the ratio column the median of
per-round ratios to ``causal`` (the baseline: SDPA is_causal). The load average is printed at
the start and end of every length: on a shared CPU only ratios within one length's rounds
compare. ``--memory``: each case's fwd+bwd also runs once in a fresh process
(``--memory-child``) that records its RSS high-water mark (Linux ``VmHWM``, reset after the
inputs are built and one small call has paged the kernels in, the way ``attnlab.bench.memory``
measures a model) minus the RSS at the reset: the attention's own peak (outputs, saved tensors,
gradients, masks and biases). A case whose dense form would hold more than ``--budget-gib`` is
skipped and says so.

Cases ("today" = ``model/attention.py``'s AttentionCore.sdpa with today's dense inputs):
causal; temperature (a learned per-head gain); alibi, alibi-today ([H, T, T] float bias);
t5, t5-today; sliding (w = 256), sliding-today ([T, T] bool); local-global (w = 256, the first 16
and every 512th token global), local-global-today; bigbird (w = 256, 16 global, 64-token blocks,
2 random), bigbird-today; document (8 packed documents of T / 8), document-today; softcap (c =
30, no fold); sigmoid (b = -log T).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

W, GLOBAL_FIRST, GLOBAL_EVERY, BB_BLOCK, BB_RANDOM = 256, 16, 512, 64, 2


def _engine_case(name: str, T: int, H: int, device):
    """(spec, today's dense ScoreContext or None) for an engine case."""
    from attnlab.model import engine as e

    causal = e.Causal()
    table = {
        "causal": (causal, ()),
        "temperature": (causal, (e.HeadScale(H),)),
        "alibi": (causal, (e.ALiBi(H),)),
        "t5": (causal, (e.T5Bias(H),)),
        "sliding": (e.Sliding(W), ()),
        "local-global": (e.LocalGlobal(W, GLOBAL_FIRST, GLOBAL_EVERY), ()),
        "bigbird": (e.BigBird(W, GLOBAL_FIRST, 0, BB_BLOCK, BB_RANDOM, seed=0), ()),
        "document": (e.Document(torch.arange(T, device=device) // (T // 8)), ()),
        "softcap": (causal, (e.SoftCap(30.0),)),
        "sigmoid": (causal, ()),
    }
    mask, mods = table[name]
    norm = e.Sigmoid.for_length(T) if name == "sigmoid" else e.Softmax()
    return e.AttentionSpec(mask, mods, norm)


def _today_context(name: str, T: int, H: int, device):
    """Today's ScoreContext for a '-today' case: the dense bool mask or [H, T, T] float bias."""
    from attnlab.model.masks import reference_pairs
    from attnlab.model.positions import ALiBi, T5RelativeBias
    from attnlab.parts import ScoreContext

    base = name.removesuffix("-today")
    pos = torch.arange(T, device=device)
    if base in ("alibi", "t5"):
        mod = ALiBi(H) if base == "alibi" else T5RelativeBias(H).to(device)
        return ScoreContext(None, True, mod(pos, pos))
    if base == "document":
        doc = pos // (T // 8)
        return ScoreContext((doc[:, None] == doc[None, :]) & (pos[None, :] <= pos[:, None]), False)
    cfg = {
        "sliding": dict(window=W),
        "local-global": dict(window=W, n_global=GLOBAL_FIRST, global_every=GLOBAL_EVERY),
        "bigbird": dict(
            window=W, n_global=GLOBAL_FIRST, block_size=BB_BLOCK, random_blocks=BB_RANDOM
        ),
    }[base]
    return ScoreContext(reference_pairs(pos, pos, True, **cfg), False)


def build(name: str, T: int, B: int, H: int, d: int, grad: bool, device="cpu"):
    """A zero-argument call running case ``name`` once (forward, and backward when ``grad``),
    and the line saying which path ran (filled after the first call)."""
    from attnlab.model.attention import AttentionCore
    from attnlab.model.engine import AttentionEngine

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, T, d, generator=g).requires_grad_(grad) for _ in range(3))
    info = {"path": ""}
    if name.endswith("-today"):
        core = AttentionCore(d)
        biased = name in ("alibi-today", "t5-today")
        kind = "a float [H,T,T] bias" if biased else "a [T,T] bool mask"
        info["path"] = f"today: SDPA with {kind}"
        ctx = None if biased else _today_context(name, T, H, device)

        def attend():  # today's model builds its bias every forward
            return core.sdpa(q, k, v, ctx or _today_context(name, T, H, device))

    else:
        eng = AttentionEngine(_engine_case(name, T, H, device))

        def attend():
            out, _ = eng(q, k, v)
            info["path"] = f"{eng.last_plan.path}: {eng.last_plan.reason}"
            return out

    def run():
        if grad:
            attend().sum().backward()
            q.grad = k.grad = v.grad = None
        else:
            with torch.no_grad():
                attend()

    return run, info


def dense_bytes(name: str, T: int, B: int, H: int) -> float:
    """What the case's dense form holds at its peak, roughly (for the memory budget)."""
    if name in ("softcap", "sigmoid"):
        return 3.0 * B * H * T * T * 4  # logits, weights and their gradient, float32
    if name in ("alibi-today", "t5-today"):
        return H * T * T * 4 + 2.0 * B * H * T * T * 4  # the bias, the math path's matrices
    if name.endswith("-today"):
        return T * T  # the [T, T] bool mask (the flash kernel keeps no matrix)
    return 0.0


def time_length(cases, T, args, grad: bool) -> dict:
    """Interleaved rounds of every case at length T -> {case: (median s, ratio, path)}."""
    runs, skipped = {}, {}
    for name in cases:
        need = dense_bytes(name, T, args.batch, args.heads) / 2**30
        if need > args.budget_gib:
            skipped[name] = f"skipped: its dense form holds ~{need:.1f} GiB > --budget-gib"
            continue
        runs[name] = build(name, T, args.batch, args.heads, args.head_dim, grad)
        runs[name][0]()  # warm-up (and the path line)
    times = {n: [] for n in runs}
    for _ in range(args.rounds):
        for name, (run, _) in runs.items():
            t0 = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t0)
    out = {}
    for name in cases:
        if name in skipped:
            out[name] = (None, None, skipped[name])
            continue
        ratio = None
        if "causal" in times:
            ratio = statistics.median(a / b for a, b in zip(times[name], times["causal"]))
        out[name] = (statistics.median(times[name]), ratio, runs[name][1]["path"])
    return out


def memory_child(spec: dict) -> dict:
    """In a fresh process: peak RSS growth of one fwd+bwd of the case."""
    from attnlab.bench.memory import _peak_rss, _reset_peak_rss

    torch.set_num_threads(spec["threads"])
    run, info = build(spec["case"], spec["T"], spec["B"], spec["H"], spec["d"], True)
    small, _ = build(spec["case"], 256, 1, spec["H"], spec["d"], True)
    small()  # page the kernels in
    import psutil

    _reset_peak_rss()
    rss0 = psutil.Process().memory_info().rss
    run()
    return {"growth_mib": (_peak_rss() - rss0) / 2**20, "path": info["path"]}


def measure_memory(name: str, T: int, args) -> float | None:
    spec = dict(case=name, T=T, B=args.batch, H=args.heads, d=args.head_dim, threads=args.threads)
    if dense_bytes(name, T, args.batch, args.heads) / 2**30 > args.budget_gib:
        return None
    out = subprocess.run(
        [sys.executable, __file__, "--memory-child", json.dumps(spec)],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1])["growth_mib"] if lines else None


def report(T: int, mode: str, rows: dict, memory: dict | None, load) -> None:
    print(f"\n## T = {T}, {mode} (load average {load[0]:.2f} -> {os.getloadavg()[0]:.2f})")
    head = "| case | s (median) | x causal |" + (" peak MiB |" if memory is not None else "")
    print(head + " path |")
    print("|---" * (head.count("|") - 1 + 1) + "|")
    for name, (sec, ratio, path) in rows.items():
        cells = [
            name,
            "-" if sec is None else f"{sec:.4f}",
            "-" if ratio is None else f"{ratio:.2f}",
        ]
        if memory is not None:
            mib = memory.get(name)
            cells.append("-" if mib is None else f"{mib:.0f}")
        print("| " + " | ".join([*cells, path]) + " |", flush=True)


#: the explicit path's cases (the [B, H, T, T] matrix)
SLOW = ("softcap", "sigmoid")
ALL = [
    "causal",
    "temperature",
    "alibi",
    "alibi-today",
    "t5",
    "t5-today",
    "sliding",
    "sliding-today",
    "local-global",
    "local-global-today",
    "bigbird",
    "bigbird-today",
    "document",
    "document-today",
    "softcap",
    "sigmoid",
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="1024,2048,8192")
    p.add_argument("--fwd-lengths", default="32768", help="forward only, at these lengths too")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--budget-gib", type=float, default=3.0)
    p.add_argument("--cases", default=",".join(ALL))
    p.add_argument(
        "--fwd-cases",
        default=",".join(c for c in ALL if not c.endswith("-today") and c not in SLOW),
        help="cases at --fwd-lengths (default: the engine's, not the explicit ones)",
    )
    p.add_argument("--rounds-long", type=int, default=2, help="rounds at T >= 8192")
    p.add_argument("--memory", action="store_true", help="peak RSS per case (fresh processes)")
    p.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.memory_child:
        print(json.dumps(memory_child(json.loads(args.memory_child))))
        return 0
    torch.set_num_threads(args.threads)
    cases = args.cases.split(",")
    print(
        f"B={args.batch} H={args.heads} d_h={args.head_dim} threads={args.threads} torch {torch.__version__}"
    )
    lengths = [int(t) for t in args.lengths.split(",") if t]
    rounds = args.rounds
    for T in lengths + [int(t) for t in args.fwd_lengths.split(",") if t]:
        modes = [("fwd+bwd", True), ("fwd", False)] if T in lengths else [("fwd", False)]
        args.rounds = args.rounds_long if T >= 8192 else rounds
        for mode, grad in modes:
            load = os.getloadavg()
            these = cases if T in lengths else args.fwd_cases.split(",")
            rows = time_length(these, T, args, grad)
            memory = None
            if args.memory and grad:
                memory = {n: measure_memory(n, T, args) for n in these}
            report(T, mode, rows, memory, load)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
