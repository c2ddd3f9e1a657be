"""Inference speed: prefill throughput and greedy decoding with and without the KV cache.

- prefill: one no-grad forward over [B, T] (every position's logits), tokens/s = B T / time;
- decode: ``generate`` greedy (temperature 0) for ``new_tokens`` after a ``prompt_len`` prompt,
  with the cache (one position per step, O(T) attention against cached K/V) and without it (the
  whole prefix recomputed every step, O(T^2)); tokens/s = B new_tokens / time;
- the two decodes must produce identical tokens, or the variant fails this section with the first
  position where they differ (a wrong cache is not a fast cache);
- a model whose parts declare ``supports_kv_cache = False`` decodes by recomputation only, and
  its row says so (no cached figures);
- cache bytes/token = ``model.new_cache(...).nbytes()`` / positions, in the weights' dtype.
"""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from attnlab.bench.subjects import Subject
from attnlab.bench.timing import error_text, interleaved, paired_ratio, synchronize
from attnlab.model import generate


class GreedyMismatchError(AssertionError):
    """Cached and uncached greedy decoding disagree: the KV cache path is wrong."""


@dataclass
class InferenceRow:
    """One variant's inference speeds. A model whose parts declare ``supports_kv_cache = False``
    decodes by recomputation only: its cached decode, cache speedup, cache bytes and greedy
    check are None."""

    name: str
    prefill_tokens_per_s: float
    prefill_ratio: float
    decode_cached_tokens_per_s: float | None
    decode_uncached_tokens_per_s: float
    cache_speedup: float | None
    cache_bytes_per_token: int | None
    cache_dtype: str
    greedy_identical: bool | None
    prompt_len: int
    new_tokens: int
    decode_batch: int

    def to_dict(self) -> dict:
        return asdict(self)


def check_greedy(model: torch.nn.Module, prompt: Tensor, new_tokens: int) -> tuple[Tensor, Tensor]:
    """Greedy tokens with and without the cache; raises GreedyMismatchError if they differ."""
    cached = generate(model, prompt, new_tokens, temperature=0.0, use_cache=True)
    plain = generate(model, prompt, new_tokens, temperature=0.0, use_cache=False)
    if not torch.equal(cached, plain):
        diff = (cached != plain).any(0).nonzero()
        pos = int(diff[0]) - prompt.shape[1] if len(diff) else -1
        raise GreedyMismatchError(
            f"greedy decoding with the KV cache differs from recomputation at new token {pos}"
        )
    return cached, plain


def cache_bytes_per_token(model: torch.nn.Module, positions: int) -> tuple[int, str]:
    p = next(model.parameters())
    cache = model.new_cache(1, positions, p.device, p.dtype)
    return cache.nbytes() // positions, str(p.dtype).removeprefix("torch.")


def measure_inference(
    subjects: list[Subject],
    *,
    batch: int,
    seq_len: int,
    prompt_len: int,
    new_tokens: int,
    decode_batch: int,
    vocab: int,
    device: torch.device | str,
    dtype: torch.dtype,
    rounds: int,
    warmup: int,
    reference: str = "baseline",
    failed: dict[str, str] | None = None,
) -> list[InferenceRow]:
    """Prefill and decode speed of every decoding subject (interleaved rounds, medians).

    With ``failed``, a subject that raises (a part's error, cached and uncached greedy tokens
    that differ) is recorded there (name -> the error) and has no row; without it the error
    propagates."""
    device = torch.device(device)
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(0, vocab, (batch, seq_len), generator=gen).to(device)
    prompt = torch.randint(0, vocab, (decode_batch, prompt_len), generator=gen).to(device)
    models, cache_info = _warm_up(subjects, x, prompt, new_tokens, dtype, failed)
    timer = functools.partial(_timed, device)
    fns = {}
    for name, m in models.items():
        fns[f"{name}/prefill"] = timer(lambda m=m: m(x))
        if name in cache_info:
            fns[f"{name}/cached"] = timer(
                lambda m=m: generate(m, prompt, new_tokens, temperature=0.0, use_cache=True)
            )
        fns[f"{name}/uncached"] = timer(
            lambda m=m: generate(m, prompt, new_tokens, temperature=0.0, use_cache=False)
        )
    lost: dict[str, str] = {}  # "name/what" -> the error of a timing that raised
    samples = interleaved(
        fns, rounds=rounds, warmup=warmup, failed=None if failed is None else lost
    )
    lost_names = {key.rsplit("/", 1)[0]: why for key, why in lost.items()}
    if failed is not None:
        failed.update(lost_names)  # a subject with any timing lost has no row
    done = [s for s in subjects if s.name in models and s.name not in lost_names]
    for s in subjects:
        s.model.train()
    if not done:
        return []
    ref = reference if any(s.name == reference for s in done) else done[0].name
    rows = []
    for s in done:
        pre = samples[f"{s.name}/prefill"]
        plain = samples[f"{s.name}/uncached"]
        cached = samples.get(f"{s.name}/cached")
        bytes_per_token, cache_dtype = cache_info.get(s.name, (None, _dtype_name(models[s.name])))
        rows.append(
            InferenceRow(
                name=s.name,
                prefill_tokens_per_s=batch * seq_len / pre.median,
                prefill_ratio=1.0 / paired_ratio(pre, samples[f"{ref}/prefill"]),
                decode_cached_tokens_per_s=decode_batch * new_tokens / cached.median
                if cached
                else None,
                decode_uncached_tokens_per_s=decode_batch * new_tokens / plain.median,
                cache_speedup=paired_ratio(plain, cached) if cached else None,
                cache_bytes_per_token=bytes_per_token,
                cache_dtype=cache_dtype,
                greedy_identical=True if cached else None,
                prompt_len=prompt_len,
                new_tokens=new_tokens,
                decode_batch=decode_batch,
            )
        )
    return rows


def _warm_up(
    subjects: list[Subject],
    x: torch.Tensor,
    prompt: torch.Tensor,
    new_tokens: int,
    dtype: torch.dtype,
    failed: dict[str, str] | None,
) -> tuple[dict[str, torch.nn.Module], dict[str, tuple[int, str]]]:
    """Each subject's model in ``dtype`` and eval mode, run once (prefill, decode); a cached
    subject's greedy tokens are checked against the uncached ones and its cache bytes per token
    recorded. A subject that raises goes to ``failed`` (or the error propagates without it)."""
    models, cache_info = {}, {}
    for s in subjects:
        try:
            m = s.model if dtype == torch.float32 else copy.deepcopy(s.model).to(dtype)
            m.eval()
            if s.caches:
                check_greedy(m, prompt, new_tokens)  # also the decode warmup
                cache_info[s.name] = cache_bytes_per_token(m, prompt.shape[1] + new_tokens)
            else:
                generate(m, prompt, new_tokens, temperature=0.0, use_cache=False)  # warmup
            with torch.no_grad():
                m(x)  # prefill warmup
        except Exception as e:
            s.model.train()
            if failed is None:
                raise
            failed[s.name] = error_text(e)
            continue
        models[s.name] = m
    return models, cache_info


def _timed(device: torch.device, fn: Callable[[], object]) -> Callable[[], float]:
    """A function that runs ``fn`` without gradients and returns its wall time in seconds,
    synchronised with the device on both ends."""

    def run() -> float:
        synchronize(device)
        t0 = time.perf_counter()
        with torch.no_grad():
            fn()
        synchronize(device)
        return time.perf_counter() - t0

    return run


def _dtype_name(model: torch.nn.Module) -> str:
    return str(next(model.parameters()).dtype).removeprefix("torch.")
