"""Decoding split by tensor parallelism (``attnlab bench --tp N`` under torchrun): tokens/s and
memory per device, against the whole model timed by the same processes.

Per variant, every rank builds the model from one seed twice, splits one copy over the "tp"
ranks (:mod:`attnlab.model.tensor_parallel`) and, in interleaved rounds (the median of
``repeats``), decodes ``new_tokens`` greedy tokens after a ``prompt_len`` prompt with the KV
cache: the whole copy (every rank decodes it alone, as a TP=1 process beside the others would)
and the split one (the ranks together). Reported per variant: both speeds (tokens/s = B x
new_tokens / seconds), whether the split greedy tokens equal the whole model's (they must), and
per rank the bytes of the weights it holds, of its KV cache at ``prompt_len + new_tokens``
positions, and on CUDA the peak allocated during the split decode
(``torch.cuda.max_memory_allocated``). On one CPU the ranks share the cores, so the CPU figures
show the cost of the collectives, not a speed-up (each rank's matmuls are 1/P as large but the
P processes contend for the same cores); the GPU figures are what the split is for.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field

import torch

from attnlab.bench.timing import synchronize
from attnlab.model import build_model, generate
from attnlab.runs.distributed import Dist


@dataclass
class TPDecodeRow:
    """One variant decoded whole and split over ``tp`` ranks (lists: one entry per rank)."""

    name: str
    tp: int
    whole_tokens_per_s: float
    split_tokens_per_s: float
    greedy_identical: bool
    weight_bytes: list[int] = field(default_factory=list)
    whole_weight_bytes: int = 0
    cache_bytes: list[int] = field(default_factory=list)
    peak_bytes: list[int] | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def held_bytes(model: torch.nn.Module) -> int:
    """Bytes of the parameters and buffers this rank holds (a split tensor: its shard)."""
    total, seen = 0, set()
    for t in (*model.parameters(), *model.buffers()):
        if id(t) in seen:
            continue
        seen.add(id(t))
        local = t.to_local() if callable(getattr(t, "to_local", None)) else t
        total += local.numel() * local.element_size()
    return total


def _timed(fn, device: torch.device) -> float:
    synchronize(device)
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - t0


def measure(
    name: str,
    cfg,
    dist: Dist,
    device: torch.device,
    *,
    dtype: torch.dtype = torch.float32,
    prompt_len: int,
    new_tokens: int,
    batch: int,
    repeats: int,
) -> TPDecodeRow:
    """Decode ``name`` (config ``cfg``, weights in ``dtype``) whole and split over ``dist``'s
    "tp" ranks."""
    from attnlab.runs.distributed import split

    torch.manual_seed(0)
    whole = build_model(cfg.model).to(device, dtype).eval()
    torch.manual_seed(0)
    model = build_model(cfg.model).to(device, dtype).eval()
    notes = split(model, dist)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, cfg.model.vocab_size, (batch, prompt_len), generator=gen)
    prompt = prompt.to(device)

    def decode(m):
        return generate(m, prompt, new_tokens, temperature=0.0, use_cache=True)

    with torch.no_grad():
        same = torch.equal(decode(whole), decode(model))  # also the warm-up
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        times: dict[str, list[float]] = {"whole": [], "split": []}
        for _ in range(repeats):
            dist.barrier()
            times["whole"].append(_timed(lambda: decode(whole), device))
            dist.barrier()
            times["split"].append(_timed(lambda: decode(model), device))
    tokens = batch * new_tokens
    positions = prompt_len + new_tokens
    p = next(model.parameters())
    cache = model.new_cache(batch, positions, device, p.dtype).nbytes()
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return TPDecodeRow(
        name=name,
        tp=dist.tp,
        whole_tokens_per_s=tokens / statistics.median(times["whole"]),
        split_tokens_per_s=tokens / statistics.median(times["split"]),
        greedy_identical=same,
        weight_bytes=dist.all_gather(held_bytes(model)),
        whole_weight_bytes=held_bytes(whole),
        cache_bytes=dist.all_gather(cache),
        peak_bytes=dist.all_gather(peak) if peak is not None else None,
        notes=notes,
    )


def table(rows: list[TPDecodeRow], machine: str) -> list[str]:
    """The rows as markdown lines (MB = 10^6 bytes)."""
    out = [
        f"decoding split by tensor parallelism ({machine})",
        "",
        "| variant | tp | whole tok/s | split tok/s | greedy same | weights/rank MB (whole) "
        "| KV cache/rank MB | peak/rank MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mb = lambda xs: " / ".join(f"{x / 1e6:.2f}" for x in xs)  # noqa: E731
        peak = mb(r.peak_bytes) if r.peak_bytes else "-"
        out.append(
            f"| {r.name} | {r.tp} | {r.whole_tokens_per_s:.1f} | {r.split_tokens_per_s:.1f} | "
            f"{'yes' if r.greedy_identical else 'NO'} | {mb(r.weight_bytes)} "
            f"({r.whole_weight_bytes / 1e6:.2f}) | {mb(r.cache_bytes)} | {peak} |"
        )
    return out
