"""Training throughput: one step = forward + backward + AdamW step on a fixed batch.

Tokens per step = B * T. ``ms/step`` is the median over interleaved rounds of the mean of ``steps``
consecutive steps; ``x baseline`` is the paired median of per-round time ratios, and
``time_ratio_best`` the ratio of the fastest rounds (on a shared machine the fastest round is the
least disturbed one, so the two together show whether load distorted the median). MFU = 3 x forward
FLOPs/token x tokens/s / peak, against the peak measured on this machine (and, on a known GPU, the
datasheet peak).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from attnlab.bench.subjects import Subject
from attnlab.bench.timing import Samples, error_text, interleaved, paired_ratio, synchronize
from attnlab.runs.compile_stats import compile_seconds
from attnlab.runs.device import Precision
from attnlab.runs.optim import param_groups


def autocast(device: torch.device | str, dtype: torch.dtype) -> contextlib.AbstractContextManager:
    """Mixed precision as the trainer does it (:class:`attnlab.runs.device.Precision`): fp32
    weights, matmuls in ``dtype`` (no loss scaling: a timing step's gradients are not kept)."""
    device = torch.device(device)
    return Precision(None if dtype == torch.float32 else dtype, device.type).autocast()


def random_batch(
    vocab: int, batch: int, seq_len: int, device: torch.device | str, seed: int = 0
) -> tuple[Tensor, Tensor]:
    """A fixed batch of uniform random tokens (speed does not depend on the token values)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq_len + 1), generator=gen)
    return ids[:, :-1].contiguous().to(device), ids[:, 1:].contiguous().to(device)


def make_train_step(
    subject: Subject,
    x: Tensor,
    y: Tensor,
    dtype: torch.dtype = torch.float32,
    lr: float = 1e-4,
) -> Callable[[], Tensor]:
    """A closure running one optimizer step and returning its loss tensor (no host sync)."""
    device = x.device
    fused = {"fused": True} if device.type == "cuda" else {}
    opt = torch.optim.AdamW(param_groups(subject.model, 0.1), lr=lr, betas=(0.9, 0.95), **fused)
    subject.model.train()

    def step() -> Tensor:
        opt.zero_grad(set_to_none=True)
        with autocast(device, dtype):
            loss = subject.loss(x, y)
        loss.backward()
        opt.step()
        return loss.detach()

    return step


@dataclass
class TrainingRow:
    name: str
    kind: str
    params: int
    flops_per_token: int
    flop_ratio: float
    ms_per_step: float
    ms_low: float
    ms_high: float
    tokens_per_s: float
    time_ratio: float
    time_ratio_best: float
    mfu_measured: float
    mfu_datasheet: float | None
    attention: str
    summary: str
    first_loss: float
    #: the untimed first step (optimizer state; compiling, with --compile or flex kernels)
    first_step_s: float = 0.0
    #: of it, compiling: torch.compile (dynamo, inductor) and the engine's kernels
    compile_s: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


#: what each attention path keeps per layer (K: the keys a query block gathers; T for a full
#: or causal mask, the window's blocks for a sliding one)
PATH_MEMORY = {
    "sdpa": "O(T)",
    "flex": "O(T)",
    "block_sparse": "O(T K)",
    "explicit": "O(H T K)",
}


def attention_paths(model: torch.nn.Module) -> list[str]:
    """The paths the model's attention layers took on their last call (``last_plan`` of each
    :class:`~attnlab.model.attention.AttentionCore`), each once, in layer order."""
    from attnlab.model.attention import AttentionCore

    paths = [
        m.last_plan.path
        for m in model.modules()
        if isinstance(m, AttentionCore) and m.last_plan is not None
    ]
    return list(dict.fromkeys(paths))


def attention_note(
    subject: Subject, batch: int, seq_len: int, paths: list[str] | None = None
) -> str:
    """The attention path(s) the subject ran and their memory: O(T) for fused SDPA or flex,
    the gathered blocks for block-sparse SDPA, the materialised [B, H, T, T] cost."""
    if not subject.materialises_attention:
        if paths:
            return ", ".join(f"{p}, {PATH_MEMORY.get(p, '?')}" for p in paths)
        if subject.config is None:
            return "SDPA, O(T)"  # a peer: its own attention call
        # compiled (the core records nothing inside a graph), or a part's own attention call
        return "not recorded"
    heads = 0
    if subject.config is not None:
        from attnlab.parts import Dims

        m = subject.config.model
        score = m.part_classes()["score"]
        heads = m.attention.n_heads
        if score is not None:
            heads = max(heads, score.heads_out(m.score, Dims.from_config(m)))
    layers = subject.config.model.n_layers if subject.config else 0
    mib = batch * heads * seq_len * seq_len * 4 / 2**20
    return f"O(T^2 H): {mib:,.1f} MiB/layer x {layers}"


def measure_training(
    subjects: list[Subject],
    *,
    batch: int,
    seq_len: int,
    vocab: int,
    device: torch.device | str,
    dtype: torch.dtype,
    steps: int,
    rounds: int,
    warmup: int,
    peak_measured: float,
    peak_datasheet: float | None,
    reference: str = "baseline",
    failed: dict[str, str] | None = None,
) -> list[TrainingRow]:
    """Time every subject's training step, interleaved, and derive throughput, ratios and MFU.

    With ``failed``, a subject whose step raises is recorded there (name -> the error) and has no
    row; without it the error propagates."""
    x, y = random_batch(vocab, batch, seq_len, device)
    first: dict[str, float] = {}
    fns = {}
    paid: dict[str, tuple[float, float, list[str]]] = {}
    for s in subjects:
        try:
            step = make_train_step(s, x, y, dtype)
            synchronize(device)
            t0, compiled = time.perf_counter(), compile_seconds()
            first[s.name] = float(step())  # also builds the optimizer state before any timing
            dt = time.perf_counter() - t0
            paid[s.name] = (dt, compile_seconds() - compiled, attention_paths(s.model))
        except Exception as e:
            if failed is None:
                raise
            failed[s.name] = error_text(e)
            continue

        def timed(step: Callable[[], Tensor] = step) -> float:
            synchronize(device)
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
            synchronize(device)
            return (time.perf_counter() - t0) / steps

        fns[s.name] = timed
    samples = interleaved(fns, rounds=rounds, warmup=warmup, failed=failed)
    if not samples:
        return []
    ref_name = reference if reference in samples else next(iter(samples))
    ref = samples[ref_name]
    ref_flops = next(s.flops_per_token for s in subjects if s.name == ref_name)
    rows = []
    for s in subjects:
        if s.name not in samples:
            continue
        smp: Samples = samples[s.name]
        tps = batch * seq_len / smp.median
        train_flops = 3.0 * s.flops_per_token * tps
        rows.append(
            TrainingRow(
                name=s.name,
                kind=s.kind,
                params=s.params,
                flops_per_token=s.flops_per_token,
                flop_ratio=s.flops_per_token / ref_flops,
                ms_per_step=1e3 * smp.median,
                ms_low=1e3 * smp.low,
                ms_high=1e3 * smp.high,
                tokens_per_s=tps,
                time_ratio=paired_ratio(smp, ref),
                time_ratio_best=smp.low / ref.low,
                mfu_measured=train_flops / peak_measured,
                mfu_datasheet=train_flops / peak_datasheet if peak_datasheet else None,
                attention=attention_note(s, batch, seq_len, paid[s.name][2]),
                summary=s.summary,
                first_loss=first[s.name],
                first_step_s=paid[s.name][0],
                compile_s=paid[s.name][1],
            )
        )
    return rows
