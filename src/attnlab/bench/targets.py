"""The CPU speed targets (issue 7), checked from one interleaved run.

Config: the ``tiny`` GPT-2 shape widened to d=256, 6 layers, 8 heads, vocab 4096, trained at
T=256 with batch 8 in float32 on 2 threads (``max_seq_len`` 512 so 256 new tokens fit after the
prompt; it only sizes the position table). Targets, each a ratio measured in the same run:

1. attnlab baseline training tokens/s >= 1.00 x nanoGPT's model at equal config;
2. nonlinear query (fused) step time <= 1.05 x baseline;
3. pre-projection + content skip step time <= (its FLOP ratio + 0.05) x baseline;
4. KV-cache greedy decoding of 256 new tokens >= 5 x faster than recomputation, same tokens.

``hf_gpt2`` and ``x_transformers`` are timed in the same rounds for context (no target).
"""

from __future__ import annotations

from collections.abc import Callable

from attnlab.bench.runner import BenchResult, BenchSpec, run_bench
from attnlab.config import load_config

TARGET_PRESET = "tiny"
TARGET_OVERRIDES: tuple[str, ...] = (
    "model.d_model=256",
    "model.n_layers=6",
    "model.attention.n_heads=8",
    "model.vocab_size=4096",
    "model.max_seq_len=512",
    "data.seq_len=256",
    "train.batch_size=8",
)
TARGET_VARIANTS = ["baseline", "baseline_unfused", "nonlinear_query", "preproj_skip"]
TARGET_PEERS = ["nanogpt", "hf_gpt2", "x_transformers"]
TARGET_THREADS = 2
DECODE_TOKENS = 256


def target_spec(
    *,
    threads: int = TARGET_THREADS,
    steps: int = 1,
    repeats: int = 11,
    context_peers: bool = True,
    memory: bool = True,
) -> BenchSpec:
    """The BenchSpec of the CPU targets (only the knobs that do not change what is measured)."""
    cfg = load_config(TARGET_PRESET, TARGET_OVERRIDES)
    return BenchSpec(
        config=cfg,
        config_name=f"{TARGET_PRESET} + {' '.join(TARGET_OVERRIDES)}",
        variants=list(TARGET_VARIANTS),
        peers=list(TARGET_PEERS if context_peers else TARGET_PEERS[:1]),
        steps=steps,
        warmup=1,
        repeats=repeats,
        threads=threads,
        device="cpu",
        dtype="float32",
        prompt_len=16,
        new_tokens=DECODE_TOKENS,
        decode_batch=1,
        decode_repeats=3,
        decode_variants=["baseline"],
        memory_steps=1,
        sections=("training", "inference", "memory") if memory else ("training", "inference"),
    )


def _target(name: str, measured: str, required: str, met: bool) -> dict:
    return {"target": name, "measured": measured, "required": required, "met": bool(met)}


def evaluate_targets(r: BenchResult) -> list[dict]:
    """The four target checks from a result (a missing row is reported as not met).

    A target is judged on the paired median ratio; the best-rounds ratio is shown beside it."""
    out = []
    base, nano = r.row("training", "baseline"), r.row("training", "nanogpt")
    if base and nano:
        speed = nano.time_ratio  # t_nanogpt / t_attnlab = attnlab tokens/s / nanoGPT tokens/s
        out.append(
            _target(
                "baseline training tokens/s vs nanoGPT (equal config)",
                f"{speed:.3f}x ({base.tokens_per_s:,.0f} vs {nano.tokens_per_s:,.0f} tok/s; "
                f"best rounds {nano.time_ratio_best:.3f}x)",
                ">= 1.00x",
                speed >= 1.0,
            )
        )
    else:
        out.append(_target("baseline vs nanoGPT", "not measured", ">= 1.00x", False))
    nl = r.row("training", "nonlinear_query")
    out.append(
        _target(
            "nonlinear query (fused) step time vs baseline",
            f"{nl.time_ratio:.3f}x (best rounds {nl.time_ratio_best:.3f}x)"
            if nl
            else "not measured",
            "<= 1.05x",
            bool(nl) and nl.time_ratio <= 1.05,
        )
    )
    pp = r.row("training", "preproj_skip")
    limit = pp.flop_ratio + 0.05 if pp else float("nan")
    out.append(
        _target(
            "pre-projection + skip step time vs baseline",
            f"{pp.time_ratio:.3f}x (best rounds {pp.time_ratio_best:.3f}x)"
            if pp
            else "not measured",
            f"<= {limit:.3f}x (FLOP ratio {pp.flop_ratio:.3f} + 0.05)" if pp else "FLOP ratio+0.05",
            bool(pp) and pp.time_ratio <= limit,
        )
    )
    dec = r.row("inference", "baseline")
    out.append(
        _target(
            f"KV-cache decode speedup, {DECODE_TOKENS} new tokens, greedy identical",
            f"{dec.cache_speedup:.2f}x ({dec.decode_cached_tokens_per_s:,.1f} vs "
            f"{dec.decode_uncached_tokens_per_s:,.1f} tok/s), identical="
            f"{'yes' if dec.greedy_identical else 'NO'}"
            if dec
            else "not measured",
            ">= 5x and identical",
            bool(dec) and dec.cache_speedup >= 5.0 and dec.greedy_identical,
        )
    )
    return out


def run_targets(log: Callable[[str], None] = print, **kwargs) -> BenchResult:
    """Run the target configuration and attach the target checks to the result."""
    result = run_bench(target_spec(**kwargs), log=log)
    result.targets = evaluate_targets(result)
    return result
