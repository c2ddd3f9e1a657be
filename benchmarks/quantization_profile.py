"""Where one cached decode step's time goes, float32 against int8 weight-only (torch.profiler).

    python benchmarks/quantization_profile.py                      # gpt2-124m's shape
    python benchmarks/quantization_profile.py --preset tiny --tokens 4    # a smoke run

Builds the preset with random weights (seed 0; speed does not depend on the values), quantizes
a copy with int8 weight-only (``--tied-head``: the LM head tied to the token embedding too, as
its own int8 copy), decodes ``--warmup`` tokens (the decode kernel compiles on its first call),
then profiles ``--tokens`` greedy tokens with the KV cache after a ``--prompt-len`` prompt and
prints, per model, the operators with the most self CPU time (``--top``) and the share of the
time spent in the Linears' products (matmuls and the decode kernel's compiled reduction).

Cost: a gpt2-124m build and quantization (seconds), the kernel's compile (tens of seconds), and
``warmup + tokens`` decoded tokens per model.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch.profiler import ProfilerActivity, profile

#: operator names whose time is the Linears' products (float32 or int8)
MATMUL_OPS = ("aten::mm", "aten::bmm", "aten::addmm", "## Call CompiledFxGraph")


def build(preset: str, overrides: list[str], tied_head: bool) -> dict[str, torch.nn.Module]:
    from attnlab.config import load_config
    from attnlab.model import build_model
    from attnlab.quant import get_scheme, quantizable_config, quantize_model

    cfg = load_config(preset, overrides)
    torch.manual_seed(0)
    fused = build_model(cfg.model).eval()
    q = build_model(quantizable_config(cfg).model).eval()
    q.load_state_dict(fused.state_dict())
    quantize_model(q, get_scheme("int8-weight"), tied_head=tied_head)
    return {"float32": fused, "int8-weight": q}


def profile_decode(model: torch.nn.Module, args: argparse.Namespace) -> str:
    from attnlab.model import generate

    vocab = model.cfg.vocab_size
    prompt = torch.randint(
        0, vocab, (1, args.prompt_len), generator=torch.Generator().manual_seed(0)
    )
    generate(model, prompt, args.warmup, temperature=0.0, use_cache=True)
    # the prompt's prefill is profiled too; its share shrinks as --tokens grows
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        generate(model, prompt, args.tokens, temperature=0.0, use_cache=True)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    products = sum(e.self_cpu_time_total for e in events if e.key.startswith(MATMUL_OPS))
    table = events.table(sort_by="self_cpu_time_total", row_limit=args.top)
    return (
        f"{total / 1e3 / args.tokens:.1f} ms of self CPU time per token (prefill included); "
        f"Linear products {100 * products / max(total, 1):.0f}%\n{table}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="gpt2-124m")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--tied-head", action="store_true", help="quantize the tied LM head too")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--top", type=int, default=15)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(
        f"load average at start {os.getloadavg()[0]:.2f}; torch {torch.__version__}, "
        f"{args.threads} threads, preset {args.preset} {args.set}, tied head "
        f"{'int8' if args.tied_head else 'float32'}"
    )
    for name, model in build(args.preset, args.set, args.tied_head).items():
        print(f"\n## {name}\n{profile_decode(model, args)}")
    print(f"load average at end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
