"""How long an experiment will take, for ``attnlab compare --plan``.

Each distinct model shape is timed on this machine: a model is built from the run's config, then
``STEPS`` optimizer steps (after one warm-up step) on random tokens of the run's shape
(``tokens_per_step`` in micro-batches of ``batch_size x seq_len``) and one validation forward
pass are timed, with the thread count a run would get (``train.threads``, else cores / jobs).
Runs of one shape share the timing (the learning rate does not change the cost). Then

    run      = steps x t_step + n_evals x eval_batches x t_eval + t_build
    total    = max(sum(run) / jobs, max(run))          (runs already over count 0)

A shape whose step would take over ``MAX_TIMED_S`` at 30% of the measured matmul peak is not
timed; its step is estimated from FLOPs instead, ``3 x F_fwd x tokens_per_step / (0.4 x peak)``.
The estimate is as good as the moment it is measured on: a loaded machine gives a longer one (the
plan prints the load average), and it is measured here, not on a cluster's nodes.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass

import numpy as np
import torch

from attnlab.config import Config
from attnlab.experiments.resolve import Experiment, RunPlan

STEPS = 3
MAX_TIMED_S = 5.0
ASSUMED_MFU = 0.4


@dataclass
class Timing:
    """Seconds per optimizer step, per validation batch and for the model build."""

    step_s: float
    eval_s: float
    build_s: float
    how: str  # "timed" | "flops"


@dataclass
class Estimate:
    total_s: float
    runs: int
    jobs: int
    timings: dict[str, Timing]  # by variant (the base name in a sweep)
    load: tuple[float, float, float] | None

    def describe(self) -> str:
        from attnlab.experiments.running.progress import fmt_duration

        parts = [
            f"{name} {t.step_s:.3g} s/step{' (from FLOPs)' if t.how == 'flops' else ''}"
            for name, t in self.timings.items()
        ]
        load = f"; load average {self.load[0]:.1f} on {os.cpu_count()} cores" if self.load else ""
        return (
            f"estimated time: {fmt_duration(self.total_s)} for {self.runs} runs with --jobs "
            f"{self.jobs} (measured now on this machine: {', '.join(parts)}{load})"
        )


def _device(cfg: Config) -> torch.device:
    from attnlab.runs.device import resolve_device

    return resolve_device(cfg.train.device, setting="train.device")


def _threads(cfg: Config, jobs: int) -> int | None:
    if cfg.train.threads:
        return cfg.train.threads
    if jobs > 1:
        return max(1, (os.cpu_count() or 1) // jobs)
    return None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _forward(model, batch):
    return model(batch.input_ids, batch.targets, return_logits=False, **batch.inputs)


def time_config(cfg: Config, flops_per_token: float, jobs: int = 1) -> Timing:
    """Time (or, for a large shape, FLOP-estimate) one training step of ``cfg`` here."""
    from attnlab.model import build_model
    from attnlab.runs.optim import recipe_optimizer
    from attnlab.runs.peak import measure_peak_flops
    from attnlab.train.objectives import make_batch, resolve_objective

    t, T = cfg.train, cfg.data.seq_len
    device = _device(cfg)
    threads = torch.get_num_threads()
    want = _threads(cfg, jobs)
    try:
        if want:
            torch.set_num_threads(want)
        plan = t.batch_plan(T)
        accum, tokens = plan.accum, plan.tokens
        step_flops = 3.0 * flops_per_token * tokens
        peak = measure_peak_flops(device)
        if step_flops / (0.3 * peak) > MAX_TIMED_S:
            step = step_flops / (ASSUMED_MFU * peak)
            return Timing(step, step / (3 * accum), 0.0, "flops")
        with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
            torch.manual_seed(0)
            t0 = time.perf_counter()
            model = build_model(cfg.model).to(device)
            build = time.perf_counter() - t0
            opt = recipe_optimizer(model, t, device)
            rng = np.random.default_rng(0)
            vocab = min(cfg.model.vocab_size, 256)
            objective = resolve_objective(cfg.model, cfg.train)

            def batch():
                x = rng.integers(0, vocab, size=(t.batch_size, T))
                y = rng.integers(0, vocab, size=(t.batch_size, T))
                b = make_batch(
                    objective,
                    x,
                    y,
                    rng,
                    vocab=vocab,
                    mask_prob=t.mask_prob,
                    eos_id=None,
                    model=cfg.model,
                )
                return b.to(device)

            data = [batch() for _ in range(accum)]
            times = []
            for i in range(STEPS + 1):
                _sync(device)
                t0 = time.perf_counter()
                for b in data:
                    (_forward(model, b).total_loss / accum).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                _sync(device)
                if i:
                    times.append(time.perf_counter() - t0)
            model.eval()
            with torch.no_grad():
                _sync(device)
                t0 = time.perf_counter()
                _forward(model, data[0])
                _sync(device)
                ev = time.perf_counter() - t0
        return Timing(float(np.median(times)), ev, build, "timed")
    finally:
        torch.set_num_threads(threads)


def _shape_key(cfg: Config) -> str:
    t = cfg.train
    return json.dumps(
        [
            cfg.model.model_dump(mode="json"),
            t.batch_size,
            t.tokens_per_step,
            cfg.data.seq_len,
            t.device,
            t.threads,
        ],
        sort_keys=True,
        default=str,
    )


def run_seconds(cfg: Config, timing: Timing) -> float:
    t = cfg.train
    n_evals = math.ceil(t.max_steps / t.eval_every)
    return t.max_steps * timing.step_s + n_evals * t.eval_batches * timing.eval_s + timing.build_s


def estimate(exp: Experiment, runs: list[RunPlan], jobs: int = 1, skip_over=None) -> Estimate:
    """Estimated wall time of ``runs`` (``skip_over(run) -> bool`` marks runs already over)."""
    cache: dict[str, Timing] = {}
    by_variant: dict[str, Timing] = {}
    seconds = []
    for r in runs:
        if skip_over is not None and skip_over(r):
            continue
        v = exp.variants[r.variant]
        key = _shape_key(r.config)
        if key not in cache:
            cache[key] = time_config(r.config, float(v.params.flops_per_token), jobs)
        by_variant.setdefault(v.base, cache[key])
        seconds.append(run_seconds(r.config, cache[key]))
    total = max(sum(seconds) / max(jobs, 1), max(seconds)) if seconds else 0.0
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return Estimate(total, len(seconds), jobs, by_variant, load)
