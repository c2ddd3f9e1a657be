"""Train one probe method: ``train_probe(cfg, run_dir) -> ProbeResult``.

One optimizer step ``s`` (0-based) reads row ``s`` of the stored batch schedule (``batch_size``
sequences of ``seq_len + 1`` tokens, split into micro-batches), averages the next-token
cross-entropy over them, clips the gradient of the trainable tensors and steps AdamW with
``lr_at(s)`` (warmup, then cosine to ``min_lr``). Only the injected / LoRA tensors train; the base
is frozen and never saved. The model runs in train mode, so a base's own dropout (GPT-2: 0.1;
Pythia, Llama: 0) is active, as under the Hugging Face ``Trainer``.

Resumable: every ``checkpoint_every`` steps (and at the end) the trainable tensors, the AdamW state
and the RNG states go to ``RUN_DIR/checkpoints/step_XXXXXXX/`` through
:func:`attnlab.train.checkpoint.write_checkpoint` (safetensors, atomic). A rerun with the same
config continues at the next step; the batches are a function of the step, so the continued run
computes what the uninterrupted one would have. A finished run is not retrained: missing
evaluation tasks are added to it.
"""

from __future__ import annotations

import contextlib
import csv
import math
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.determinism import deterministic_mode
from attnlab.errors import UserError
from attnlab.eval.lm import pick_device
from attnlab.probe import artifacts
from attnlab.probe.build import BaseProvider, ProbedModel, build_probed_model
from attnlab.probe.config import ProbeConfig, dump_probe_toml
from attnlab.probe.data import micro_batches, probe_data, train_schedule
from attnlab.probe.evaluation import evaluate_probe, result_key, validation_loss
from attnlab.probe.skip_norms import write_skip_norms
from attnlab.train import checkpoint, rundir
from attnlab.train.optim import lr_at, set_lr

Log = Callable[[str], None]
_AUTOCAST = {"bfloat16": torch.bfloat16, "float16": torch.float16}
# sections a rerun may change without invalidating the trained adapter
_UNCHECKED = ("eval", "name")


@dataclass
class ProbeResult:
    """What one probe run ended with."""

    label: str
    method: str
    status: str  # finished | diverged | failed
    run_dir: str
    steps: int
    counts: dict[str, Any]
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    skip_norms: list[float | None] = field(default_factory=list)
    final_loss: float | None = None
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def autocast_for(cfg: ProbeConfig, device: torch.device) -> Callable[[], Any]:
    """A context-manager factory: bf16 autocast on CUDA for ``auto``, nothing for float32."""
    name = cfg.train.dtype
    if name == "auto":
        name = "bfloat16" if device.type == "cuda" else "float32"
    if name == "float32":
        return contextlib.nullcontext
    return lambda: torch.autocast(device.type, dtype=_AUTOCAST[name])


def enable_gradient_checkpointing(model: nn.Module, use_reentrant: bool = True) -> None:
    """Activation checkpointing on the transformers model, with input gradients enabled.

    With every base parameter frozen nothing entering a checkpointed layer requires grad, so the
    reentrant form would return no gradient for the injected modules inside it (and the loss
    would not require grad at all); ``enable_input_require_grads`` makes the embedding output
    require grad, which fixes both forms.
    """
    from attnlab.probe.inject import unwrap

    hf = unwrap(model)
    kwargs = {"use_reentrant": use_reentrant}
    if hasattr(hf, "activation_checkpointing_enable"):
        hf.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:  # transformers < 5.2x
        hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    hf.enable_input_require_grads()


def build_optimizer(probed: ProbedModel, cfg: ProbeConfig) -> torch.optim.AdamW:
    """AdamW over the trainable tensors; weight decay on >= 2-D ones only."""
    t = cfg.train
    params = [p for _, p in probed.trainable()]
    decay = [p for p in params if p.ndim >= 2]
    other = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": t.weight_decay}]
    if other:
        groups.append({"params": other, "weight_decay": 0.0})
    return torch.optim.AdamW(groups, lr=t.lr, betas=(t.beta1, t.beta2), eps=1e-8)


def lm_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, autocast: Any) -> torch.Tensor:
    """Mean next-token cross-entropy (float32 logits) of ``x`` against ``y``."""
    with autocast():
        logits = model(input_ids=x).logits
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())


# ----------------------------------------------------------------------------------- run dir


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def check_or_write_config(run_dir: Path, cfg: ProbeConfig) -> None:
    """Write ``probe.toml``, or refuse to resume a run started with a different recipe."""
    path = run_dir / artifacts.PROBE_TOML
    if path.is_file():
        from attnlab.probe.config import load_probe_config

        saved = load_probe_config(path)
        a, b = _flat(saved.to_dict()), _flat(cfg.to_dict())
        diff = [
            f"{k}: {a.get(k)!r} -> {b.get(k)!r}"
            for k in sorted(set(a) | set(b))
            if k.split(".", 1)[0] not in _UNCHECKED and a.get(k) != b.get(k)
        ]
        if diff:
            raise UserError(
                f"{run_dir} was started with a different probe config; resuming would mix two "
                "runs. Differences (saved -> given):\n  "
                + "\n  ".join(diff)
                + "\nUse another --out, or --restart to delete this run's progress"
            )
    run_dir.mkdir(parents=True, exist_ok=True)
    from attnlab.data.atomic import atomic_write_bytes

    atomic_write_bytes(path, dump_probe_toml(cfg).encode())


def clear_run(run_dir: Path) -> None:
    """Delete the files a probe run writes (for ``--restart``); nothing else is touched."""
    for name in (
        checkpoint.CHECKPOINTS,
        artifacts.LORA_DIR,
        "eval",
    ):
        shutil.rmtree(run_dir / name, ignore_errors=True)
    for name in (
        artifacts.PROBE_JSON,
        artifacts.PROBE_TOML,
        artifacts.ADAPTER,
        rundir.STATUS_FILE,
        rundir.METRICS_FILE,
        "skip_norms.csv",
        "skip_norms.md",
        "skip_norms.png",
    ):
        (run_dir / name).unlink(missing_ok=True)


# ------------------------------------------------------------------------------- checkpoints


def _save_checkpoint(
    run_dir: Path, step: int, probed: ProbedModel, opt: Any, sched: str, loss: float | None
) -> None:
    state = {n: p.detach() for n, p in probed.trainable()}
    extra = {"rng": checkpoint.rng_state(), "schedule_hash": sched, "loss": loss}
    checkpoint.write_checkpoint(run_dir, step, state, opt.state_dict(), extra)


def _restore(ckpt: checkpoint.Checkpoint, probed: ProbedModel, opt: Any, sched: str) -> int:
    if ckpt.state.get("schedule_hash") != sched:
        raise UserError(
            f"{ckpt.path} was trained on another batch schedule (the data or recipe changed); "
            "use --restart or another --out"
        )
    params = dict(probed.trainable())
    missing = sorted(set(params) - set(ckpt.model))
    if missing or set(ckpt.model) - set(params):
        raise UserError(f"{ckpt.path} does not hold this method's tensors (missing {missing[:3]})")
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(ckpt.model[n])
    assert ckpt.optim is not None
    osd = {"state": {int(k): v for k, v in ckpt.optim["state"].items()}}
    osd["param_groups"] = ckpt.optim["param_groups"]
    opt.load_state_dict(osd)
    checkpoint.set_rng_state(ckpt.state["rng"])
    return ckpt.step


# ------------------------------------------------------------------------------------- train


def _train_loop(
    cfg: ProbeConfig, run_dir: Path, probed: ProbedModel, data: Any, log: Log, label: str
) -> tuple[str, int, float | None, str]:
    """Returns (status, steps done, last loss, reason)."""
    t = cfg.train
    device = next(probed.model.parameters()).device
    autocast = autocast_for(cfg, device)
    schedule = train_schedule(cfg, data)
    if t.gradient_checkpointing:
        enable_gradient_checkpointing(probed.model)
    opt = build_optimizer(probed, cfg)
    params = [p for _, p in probed.trainable()]
    ckpt = checkpoint.load_latest(run_dir)
    start, last = 0, None
    if ckpt is not None:
        start, last = _restore(ckpt, probed, opt, schedule.hash), ckpt.state.get("loss")
        log(f"[{label}] resuming at step {start}/{t.steps}")
    metrics = rundir.MetricsLog(run_dir, keep_through_step=start)
    model = probed.model
    model.train()
    t0, tokens = time.perf_counter(), 0
    try:
        for s in range(start, t.steps):
            lr = lr_at(s, lr=t.lr, min_lr=t.min_lr, warmup_steps=t.warmup_steps, max_steps=t.steps)
            set_lr(opt, lr)
            total = 0.0
            for x, y in micro_batches(data, schedule.offsets[s], t.seq_len, t.micro):
                xt, yt = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
                loss = lm_loss(model, xt, yt, autocast) / t.accumulation
                loss.backward()
                total += float(loss.detach())
                tokens += yt.numel()
            if not math.isfinite(total):
                opt.zero_grad(set_to_none=True)
                rundir.write_status(
                    run_dir, {"status": "diverged", "step": s, "reason": f"loss {total}"}
                )
                return "diverged", s, total, f"non-finite loss {total} at step {s}"
            clip = t.grad_clip if t.grad_clip > 0 else math.inf
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, clip))
            opt.step()
            opt.zero_grad(set_to_none=True)
            step, last = s + 1, total
            row: dict[str, Any] = {"step": step, "loss": total, "lr": lr, "grad_norm": grad_norm}
            if t.eval_every and step % t.eval_every == 0:
                row["val_loss"] = validation_loss(
                    model, data, t.seq_len, cfg.eval.val_sequences, t.micro, autocast
                )
            if step % t.log_every == 0 or step == t.steps or "val_loss" in row:
                elapsed = time.perf_counter() - t0
                row |= {
                    "tokens": step * t.batch_size * t.seq_len,
                    "tokens_per_s": tokens / elapsed if elapsed > 0 else None,
                    "elapsed": elapsed,
                }
                metrics.append(row)
                val = f" val {row['val_loss']:.4f}" if "val_loss" in row else ""
                log(f"[{label}] step {step}/{t.steps} loss {total:.4f}{val} lr {lr:.2e}")
            if step % t.checkpoint_every == 0 or step == t.steps:
                _save_checkpoint(run_dir, step, probed, opt, schedule.hash, total)
                rundir.write_status(run_dir, {"status": "running", "step": step})
    finally:
        metrics.close()
    return "finished", t.steps, last, ""


def train_probe(
    cfg: ProbeConfig,
    run_dir: str | Path,
    *,
    base: BaseProvider = None,
    restart: bool = False,
    data_root: str | Path = "data",
    log: Log = _stderr,
) -> ProbeResult:
    """Train (or resume, or just evaluate) ``cfg``'s method into ``run_dir``.

    ``base`` = a (model, tokenizer) loaded from ``cfg.base`` to use instead of loading it again;
    it is modified (frozen, injected), so pass a copy to keep the original.
    """
    run_dir = Path(run_dir)
    if restart:
        clear_run(run_dir)
    check_or_write_config(run_dir, cfg)
    label = cfg.label
    status = rundir.read_status(run_dir) or {}
    if status.get("status") in ("finished", "diverged") and (run_dir / "probe.json").is_file():
        return _rerun_finished(cfg, run_dir, status, data_root, log)
    t = cfg.train
    if t.threads:
        torch.set_num_threads(t.threads)
    device = pick_device(t.device)
    probed = build_probed_model(cfg, device, base)
    counts = probed.counts()
    artifacts.save_probe(run_dir, probed, cfg, 0)
    log(
        f"[{label}] {probed.source.label}: method {probed.method.name}, "
        f"{counts['trainable']:,} trainable params"
    )
    data = probe_data(cfg, probed.source, probed.tokenizer, data_root)
    rundir.write_status(run_dir, {"status": "running", "step": 0, "method": probed.method.name})
    state, steps, last, reason = "finished", 0, None, ""
    if counts["trainable"] and t.steps:
        with deterministic_mode(t.deterministic, device):
            state, steps, last, reason = _train_loop(cfg, run_dir, probed, data, log, label)
    artifacts.save_probe(run_dir, probed, cfg, steps)
    norms = _write_norms(probed, run_dir, label)
    results: dict[str, dict[str, Any]] = {}
    if state == "finished":
        probed.model.eval()
        results = evaluate_probe(probed.model, probed.tokenizer, data, cfg, run_dir)
    final = {"status": state, "step": steps, "method": probed.method.name, "reason": reason}
    rundir.write_status(run_dir, final | {"final_loss": last, "params": counts})
    return ProbeResult(
        label, probed.method.name, state, str(run_dir), steps, counts, results, norms, last, reason
    )


def _write_norms(probed: ProbedModel, run_dir: Path, label: str) -> list[float | None]:
    if probed.injection is None:
        return []
    norms = probed.injection.skip_norms()
    write_skip_norms({label: norms}, run_dir)
    return norms


def _rerun_finished(
    cfg: ProbeConfig, run_dir: Path, status: dict[str, Any], data_root: str | Path, log: Log
) -> ProbeResult:
    """A finished run: report it, evaluating only the tasks its results do not have yet."""
    from attnlab.eval.results import load_results, results_path

    record = artifacts.read_probe_json(run_dir)
    path = results_path(run_dir)
    have = load_results(path)["tasks"] if path.is_file() else {}
    keys = {t: result_key(t, cfg.eval.limit) for t in cfg.eval.tasks}
    todo = [t for t, k in keys.items() if k not in have] if status["status"] == "finished" else []
    if todo:
        log(f"[{cfg.label}] finished earlier; evaluating {', '.join(todo)}")
        probed = artifacts.load_probed(run_dir, pick_device(cfg.train.device))
        data = probe_data(cfg, probed.source, probed.tokenizer, data_root)
        have = {**have, **evaluate_probe(probed.model, probed.tokenizer, data, cfg, run_dir, todo)}
    else:
        log(f"[{cfg.label}] already {status['status']}; nothing to train")
    return ProbeResult(
        cfg.label,
        record["method"],
        status["status"],
        str(run_dir),
        int(record.get("trained_steps", 0)),
        record.get("params", {}),
        {k: have[k] for k in keys.values() if k in have},
        _read_norms(run_dir, cfg.label),
        status.get("final_loss"),
        status.get("reason", ""),
    )


def _read_norms(run_dir: Path, label: str) -> list[float | None]:
    path = run_dir / "skip_norms.csv"
    if not path.is_file():
        return []
    with open(path, encoding="utf-8") as f:
        return [float(r[label]) if r.get(label) else None for r in csv.DictReader(f)]
