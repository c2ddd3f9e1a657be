"""Decode speed and memory of full-precision and quantized models, measured the same way.

- decode tokens/s: greedy ``generate`` with the KV cache, ``new_tokens`` after a
  ``prompt_len``-token prompt at batch 1, every model timed once per round, rounds interleaved
  (a busy machine slows every model of a round alike; the median over rounds is reported with
  the load average before and after, and the speedup both as a ratio of medians and as the
  median, min and max of the per-round ratios: the spread);
- peak memory: a fresh Python per model (``python -m attnlab.quant.speed memory ...``): resident
  memory of the runtime (imports, torchao's included for every model), after loading, then the high-water mark of one
  cached decode after resetting it (``/proc/self/clear_refs``), so the KV cache and the
  decode's activations count and the loading's transient copies do not;
- weight bytes: the bytes of every stored tensor (a torchao tensor's int data, scales and zero
  points), the tied LM head once.

Cost: ``repeats`` x (one decode per model) plus one subprocess per model for memory.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch import nn

from attnlab.bench.timing import interleaved
from attnlab.model import generate


@dataclass
class SpeedRow:
    """One model's decode speed (median and best over rounds) and memory."""

    name: str
    decode_tokens_per_s: float
    decode_tokens_per_s_best: float
    speedup: float
    weight_bytes: int
    #: resident memory of the runtime alone (imports), after loading, and peak while decoding
    rss_runtime_mib: float | None = None
    rss_loaded_mib: float | None = None
    peak_decode_mib: float | None = None
    #: the per-round speedups against the baseline's same round (paired): median, min, max
    speedup_paired: float | None = None
    speedup_low: float | None = None
    speedup_high: float | None = None
    #: decode tokens/s of every round, in order
    rounds_tokens_per_s: list[float] | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def weight_bytes(model: nn.Module) -> int:
    """Bytes of every parameter and buffer as stored (a quantized weight by its inner tensors)."""
    from attnlab.base.finite import plain_tensors

    seen, total = set(), 0
    for _, t in plain_tensors(model):
        key = (t.data_ptr(), t.numel()) if t.data_ptr() else id(t)
        if key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def _decoder(
    model: nn.Module, prompt: torch.Tensor, new_tokens: int, rows_layout: bool | None = None
) -> Callable[[], float]:
    def run() -> float:
        t = time.perf_counter()
        generate(
            model, prompt, new_tokens, temperature=0.0, use_cache=True, rows_layout=rows_layout
        )
        return time.perf_counter() - t

    return run


def decode_speeds(
    models: dict[str, nn.Module],
    *,
    prompt_len: int = 16,
    new_tokens: int = 64,
    repeats: int = 5,
    warmup: int = 1,
    baseline: str | None = None,
    seed: int = 0,
    plain: frozenset[str] = frozenset(),
) -> list[SpeedRow]:
    """Interleaved cached-decode timing of ``models`` (the first, or ``baseline``, is 1.00x).
    The models named in ``plain`` decode without ``decode_layout`` (``model/linear.py``): each
    Linear's own ``F.linear``, a quantized weight's torchao kernel instead of a decode kernel."""
    first = next(iter(models.values()))
    vocab = first.cfg.vocab_size
    prompt = torch.randint(0, vocab, (1, prompt_len), generator=torch.Generator().manual_seed(seed))
    fns = {
        name: _decoder(m, prompt, new_tokens, False if name in plain else None)
        for name, m in models.items()
    }
    samples = interleaved(fns, repeats, warmup=warmup)
    ref = samples[baseline or next(iter(models))]
    rows = []
    for name, s in samples.items():
        paired = sorted(r / t for r, t in zip(ref.seconds, s.seconds))
        rows.append(
            SpeedRow(
                name=name,
                decode_tokens_per_s=new_tokens / s.median,
                decode_tokens_per_s_best=new_tokens / s.low,
                speedup=ref.median / s.median,
                weight_bytes=weight_bytes(models[name]),
                speedup_paired=statistics.median(paired),
                speedup_low=paired[0],
                speedup_high=paired[-1],
                rounds_tokens_per_s=[new_tokens / t for t in s.seconds],
            )
        )
    return rows


# ------------------------------------------------------------------------------ memory, per process
def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _hwm() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _load_for_memory(spec: dict) -> nn.Module:
    """``spec``: {"quantized": DIR}, {"run": RUN_OR_CHECKPOINT} or {"preset": NAME, "overrides":
    [...]} (float32, random)."""
    if "quantized" in spec:
        from attnlab.quant.store import load

        return load(spec["quantized"]).model
    if "run" in spec:
        from attnlab.quant.run import load_source

        return load_source(spec["run"])[0]
    from attnlab.config import load_config
    from attnlab.model import build_model

    torch.manual_seed(0)
    return build_model(load_config(spec["preset"], spec.get("overrides", [])).model).eval()


def memory_child(spec: dict) -> dict:
    """Run in a fresh process: RSS after loading, peak RSS of one cached decode (MiB)."""
    import gc

    from attnlab.quant.schemes import quiet_torchao

    torch.set_num_threads(int(spec.get("threads") or torch.get_num_threads()))
    with quiet_torchao():  # every model's process holds the same runtime (torchao's ~90 MiB)
        import torchao.prototype.safetensors.safetensors_support  # noqa: F401
    gc.collect()
    runtime = _rss()
    model = _load_for_memory(spec)
    gc.collect()
    loaded = _rss()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    prompt = torch.zeros(1, int(spec["prompt_len"]), dtype=torch.long)
    layout = False if spec.get("plain") else None  # as decode_speeds' ``plain``
    generate(
        model, prompt, int(spec["new_tokens"]), temperature=0.0, use_cache=True, rows_layout=layout
    )
    return {
        "rss_runtime_mib": runtime / 2**20,
        "rss_loaded_mib": loaded / 2**20,
        "peak_decode_mib": _hwm() / 2**20,
    }


def measure_memory(spec: dict, timeout: float = 600) -> dict:
    """``memory_child(spec)`` in a fresh Python (so nothing another model left counts)."""
    proc = subprocess.run(
        [sys.executable, "-m", "attnlab.quant.speed", "memory", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ),
    )
    if proc.returncode != 0:
        raise RuntimeError(f"memory probe failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "memory":
        print(json.dumps(memory_child(json.loads(argv[1]))))
        return 0
    print("usage: python -m attnlab.quant.speed memory SPEC_JSON", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
