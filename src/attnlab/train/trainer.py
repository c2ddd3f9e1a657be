"""The from-scratch pretraining loop (SPEC 2.1): ``train(cfg, run_dir) -> RunResult``.

One optimizer step ``s`` (0-based):

1. ``lr = lr_at(s)`` (linear warmup, cosine to ``min_lr``);
2. for each of ``A`` micro-batches: the fixed schedule's slice ``k = rank * A + m`` is corrupted by
   the objective with an RNG seeded by ``(seed, s, k)``, and ``total_loss / A`` is backpropagated
   (gradient sync only on the last micro-batch);
3. the step loss (mean over micro-batches and ranks) and the pre-clip gradient norm are checked for
   divergence; a healthy step clips, steps AdamW and counts ``B * T * A * W`` tokens;
4. every ``eval_every`` steps the fixed validation sequences are scored, every ``log_every`` a
   metrics row is written, every ``checkpoint_every`` a checkpoint.

Everything a step depends on is a function of the step index or is stored in the checkpoint
(weights, AdamW moments, RNG states, divergence statistics), so a run killed at any point and
started again reproduces the uninterrupted run's losses bit for bit.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import attnlab
from attnlab.config import Config, dump_toml, load_config
from attnlab.determinism import deterministic_mode
from attnlab.errors import UserError
from attnlab.train import batches, checkpoint, rundir
from attnlab.train.distributed import Dist, resolve_device, setup, wrap
from attnlab.train.divergence import DivergenceMonitor
from attnlab.train.objectives import (
    Batch,
    Objective,
    corruption_rng,
    extra_ids,
    make_batch,
    resolve_objective,
)
from attnlab.train.optim import build_optimizer, lr_at, set_lr
from attnlab.train.peak import measure_peak_flops, mfu
from attnlab.train.progress import ProgressEvent, ProgressFn

FINAL_STATES = ("finished", "diverged")


@dataclass
class RunResult:
    """What a call to :func:`train` ended with (also what a rerun of a finished run reports)."""

    status: str  # finished | diverged | running (stopped early) | failed
    run_dir: str
    steps: int
    max_steps: int
    final_val_loss: float | None
    best_val_loss: float | None
    final_loss: float | None
    tokens: int
    wall_time: float
    tokens_per_s: float
    schedule_hash: str
    reason: str | None = None
    resumed_from: int | None = None
    already_done: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Precision:
    """Autocast dtype (None = full fp32) and the fp16 loss scaler."""

    dtype: torch.dtype | None
    device_type: str
    scaler: torch.amp.GradScaler | None = None

    @property
    def name(self) -> str:
        return "float32" if self.dtype is None else str(self.dtype).removeprefix("torch.")

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)


def _precision(pref: str, device: torch.device) -> _Precision:
    cuda = device.type == "cuda"
    if pref == "auto":
        pref = "bfloat16" if cuda and torch.cuda.is_bf16_supported() else "float32"
    if pref == "float32":
        return _Precision(None, device.type)
    if pref == "float16":
        if not cuda:
            raise UserError("train.dtype='float16' needs a CUDA device; use 'bfloat16' or 'auto'")
        return _Precision(torch.float16, "cuda", torch.amp.GradScaler("cuda"))
    return _Precision(torch.bfloat16, device.type)


@dataclass
class _State:
    """Counters that a checkpoint carries besides weights and optimizer moments."""

    step: int = 0
    tokens: int = 0
    elapsed: float = 0.0  # wall seconds across sessions, evaluation and checkpoints included
    train_time: float = 0.0  # seconds spent in optimizer steps only
    best_val_loss: float | None = None
    last_val_loss: float | None = None
    last_loss: float | None = None
    monitor: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------------------ helpers


def _forward(model: nn.Module, batch: Batch):
    """Loss only: the LM head and cross-entropy run chunked, without the [B, T, V] logits."""
    kw = {"return_logits": False}
    if batch.encoder_input_ids is not None:
        kw["encoder_input_ids"] = batch.encoder_input_ids
    return model(batch.input_ids, batch.targets, **kw)


@contextlib.contextmanager
def _grad_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Skip the gradient all-reduce on all but the last micro-batch (DDP ``no_sync``, FSDP2)."""
    if enabled:
        yield
    elif hasattr(model, "no_sync"):
        with model.no_sync():
            yield
    elif hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        yield


def _as_float(t: torch.Tensor) -> float:
    full = getattr(t, "full_tensor", None)  # a DTensor under FSDP2
    return float((full() if callable(full) else t).item())


def _state_dicts(raw: nn.Module, optimizer, fsdp: bool) -> tuple[dict, dict]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True) if fsdp else None
    return get_state_dict(raw, optimizer, options=opts)


def _load_state_dicts(raw: nn.Module, optimizer, ckpt: checkpoint.Checkpoint, fsdp: bool) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    opts = StateDictOptions(full_state_dict=True) if fsdp else None
    try:
        set_state_dict(
            raw,
            optimizer,
            model_state_dict=ckpt.model,
            optim_state_dict=ckpt.optim,
            options=opts,
        )
    except (RuntimeError, KeyError, ValueError) as e:
        raise UserError(
            f"checkpoint {ckpt.path} does not fit this model ({e}); was the model code changed? "
            "Rerun with --restart to start over"
        ) from None


def _n_params(model: nn.Module) -> int:
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def _run_result(run_dir: Path, status: dict[str, Any], already_done: bool) -> RunResult:
    return RunResult(
        status=status.get("status", "unknown"),
        run_dir=str(run_dir),
        steps=int(status.get("step", 0)),
        max_steps=int(status.get("max_steps", 0)),
        final_val_loss=status.get("final_val_loss"),
        best_val_loss=status.get("best_val_loss"),
        final_loss=status.get("last_loss"),
        tokens=int(status.get("tokens", 0)),
        wall_time=float(status.get("elapsed", 0.0)),
        tokens_per_s=float(status.get("tokens_per_s", 0.0)),
        schedule_hash=str(status.get("schedule_hash", "")),
        reason=status.get("reason"),
        resumed_from=status.get("resumed_from"),
        already_done=already_done,
    )


def _clear_run(run_dir: Path) -> None:
    """Remove this trainer's files from ``run_dir`` (``--restart``); other files are left alone."""
    import shutil

    shutil.rmtree(run_dir / checkpoint.CHECKPOINTS, ignore_errors=True)
    for name in (rundir.METRICS_FILE, rundir.STATUS_FILE, rundir.CONFIG_FILE):
        (run_dir / name).unlink(missing_ok=True)


# --------------------------------------------------------------------------------------- train


def train(
    cfg: Config,
    run_dir: str | Path,
    *,
    progress: ProgressFn | None = None,
    resume: bool = True,
    _stop_after: int | None = None,
) -> RunResult:
    """Train ``cfg`` into ``run_dir``, resuming from its newest complete checkpoint.

    ``progress`` receives :class:`~attnlab.train.progress.ProgressEvent` on rank 0 (None: silent).
    ``resume=False`` deletes the run's previous progress first. A finished or diverged run is not
    trained again; its stored result is returned. Under ``torchrun`` every rank calls this; only
    rank 0 writes files. The caller's RNG state and thread count are restored on return.
    ``_stop_after`` (tests) returns after that many steps as if the process had been killed.
    """
    run_dir = Path(run_dir)
    dist = setup(cfg.train.device)
    threads = torch.get_num_threads()
    try:
        device = resolve_device(cfg.train.device, dist)
        forked = [device.index or 0] if device.type == "cuda" else []
        with (
            torch.random.fork_rng(devices=forked),
            deterministic_mode(cfg.train.deterministic, device),
        ):
            if cfg.train.threads:
                torch.set_num_threads(cfg.train.threads)
            return _Trainer(cfg, run_dir, dist, device, progress).run(resume, _stop_after)
    finally:
        torch.set_num_threads(threads)
        dist.close()


class _Trainer:
    """One call of :func:`train`: all state lives here, none in module globals."""

    def __init__(
        self,
        cfg: Config,
        run_dir: Path,
        dist: Dist,
        device: torch.device,
        progress: ProgressFn | None,
    ) -> None:
        self.run_dir, self.dist, self.device = run_dir, dist, device
        self.progress = progress if dist.is_main else None
        self.precision = _precision(cfg.train.dtype, device)
        self.data_dir = batches.resolve_data_dir(cfg)
        self.given_cfg = cfg
        self.cfg = cfg.model_copy(deep=True)
        self.cfg.data.dir = str(self.data_dir)
        self.fsdp = dist.enabled and cfg.train.parallel == "fsdp"

    # ---------------------------------------------------------------------------- run setup

    def _check_existing(self, resume: bool) -> RunResult | None:
        """Refuse a mismatched config; return the stored result of a run that is over."""
        cfg_path = self.run_dir / rundir.CONFIG_FILE
        if self.run_dir.exists() and not self.run_dir.is_dir():
            raise UserError(f"--out {self.run_dir} is a file; give a directory for the run")
        if not resume:
            self.dist.barrier()
            if self.dist.is_main and self.run_dir.exists():
                _clear_run(self.run_dir)
            self.dist.barrier()
            return None
        if not cfg_path.is_file():
            return None
        saved = load_config(str(cfg_path))
        rundir.check_same_config(self.run_dir, saved, self.cfg)
        status = rundir.read_status(self.run_dir) or {}
        if status.get("status") in FINAL_STATES:
            return _run_result(self.run_dir, status, already_done=True)
        return None

    def _setup_data(self) -> None:
        from attnlab.data import TokenData, get_schedule

        cfg, dist = self.cfg, self.dist
        if dist.is_main:
            batches.prepare_if_missing(self.given_cfg, self.data_dir)
        dist.barrier()
        self.data = TokenData.open(self.data_dir)
        self.tokenizer = self.data.tokenizer
        self.objective: Objective = resolve_objective(cfg.model, cfg.train)
        seq_len = cfg.data.seq_len
        tok_vocab = int(self.tokenizer.vocab_size)
        need = tok_vocab + extra_ids(self.objective, seq_len, cfg.train.mask_prob)
        if need > cfg.model.vocab_size:
            extra = need - tok_vocab
            what = f" + {extra} ids for {self.objective} (mask/sentinels)" if extra else ""
            raise UserError(
                f"tokenizer {cfg.data.tokenizer!r} has {tok_vocab} tokens{what} = {need}, but "
                f"model.vocab_size={cfg.model.vocab_size}; set model.vocab_size to at least "
                f"{need} (a multiple of 64 is fastest, e.g. {-(-need // 64) * 64})"
            )
        self.vocab = tok_vocab
        self.eos_id = getattr(self.tokenizer, "eos_id", None)
        t = cfg.train
        self.accum = batches.grad_accum_steps(t.tokens_per_step, t.batch_size, seq_len, dist.world)
        self.global_batch = t.batch_size * self.accum * dist.world
        self.tokens_per_step = self.global_batch * seq_len

        def schedules():
            train_s = get_schedule(
                self.data_dir, "train", seq_len, self.global_batch, t.max_steps, t.seed
            )
            val_s = get_schedule(
                self.data_dir, "val", seq_len, t.batch_size, t.eval_batches, batches.EVAL_SEED
            )
            return train_s, val_s

        if dist.is_main:  # rank 0 creates and stores the schedules, the others then read them
            self.schedule, self.val_schedule = schedules()
        dist.barrier()
        if not dist.is_main:
            self.schedule, self.val_schedule = schedules()
        self.offsets = np.asarray(self.schedule.offsets)
        self.val_offsets = np.asarray(self.val_schedule.offsets)

    def _setup_model(self) -> None:
        from attnlab.model import build_model

        cfg = self.cfg
        torch.manual_seed(cfg.train.seed)
        self.raw = build_model(cfg.model).to(self.device)
        torch.manual_seed(cfg.train.seed + self.dist.rank)  # dropout masks differ across ranks
        self.n_params = _n_params(self.raw)
        fpt = getattr(self.raw, "flops_per_token", None)
        self.flops_per_token = (
            float(fpt(cfg.data.seq_len)) if callable(fpt) else 2.0 * self.n_params
        )
        if self.fsdp:  # shards in place; the optimizer below then holds the local shards
            wrap(self.raw, "fsdp", self.dist, self.device)
        core = torch.compile(self.raw) if cfg.train.compile else self.raw
        self.eval_model = core  # DDP: evaluate without its hooks; FSDP: every rank runs it
        self.model = wrap(core, "ddp", self.dist, self.device) if not self.fsdp else core
        t = cfg.train
        self.optimizer = build_optimizer(
            self.raw,
            lr=t.lr,
            weight_decay=t.weight_decay,
            betas=(t.beta1, t.beta2),
            device=self.device,
        )
        self.params = [p for g in self.optimizer.param_groups for p in g["params"]]

    def _resume(self) -> tuple[_State, DivergenceMonitor, int | None]:
        """Load the newest complete checkpoint (rank 0 picks it, every rank reads it)."""
        state, monitor = _State(), DivergenceMonitor(self.cfg.train.spike_factor)
        path = None
        if self.dist.is_main:
            ckpt = checkpoint.load_latest(self.run_dir)
            path = None if ckpt is None else str(ckpt.path)
        path = self.dist.broadcast(path)
        if path is None:
            return state, monitor, None
        if not self.dist.is_main:
            ckpt = checkpoint.read_checkpoint(Path(path))
        assert ckpt is not None
        saved_hash = ckpt.state.get("schedule_hash")
        if saved_hash and saved_hash != self.schedule.hash:
            raise UserError(
                f"the batch schedule changed since {ckpt.path} was written (hash {saved_hash} -> "
                f"{self.schedule.hash}): the data directory {self.data_dir} was re-prepared. "
                "Restore it, or rerun with --restart"
            )
        _load_state_dicts(self.raw, self.optimizer, ckpt, self.fsdp)
        s = ckpt.state
        state = _State(
            step=ckpt.step,
            tokens=int(s["tokens"]),
            elapsed=float(s["elapsed"]),
            train_time=float(s["train_time"]),
            best_val_loss=s.get("best_val_loss"),
            last_val_loss=s.get("last_val_loss"),
            last_loss=s.get("last_loss"),
        )
        monitor.load_state_dict(s["monitor"])
        rngs = s.get("rng", [])
        if len(rngs) == self.dist.world:
            checkpoint.set_rng_state(rngs[self.dist.rank])
        return state, monitor, ckpt.step

    # -------------------------------------------------------------------------------- pieces

    def _micro_batch(self, step: int, k: int) -> Batch:
        cfg = self.cfg
        off = batches.micro_offsets(self.offsets, step, k, cfg.train.batch_size)
        return self._batch(self.data.train, off, step, k, cfg.train.seed)

    def _batch(self, tokens, off: np.ndarray, step: int, k: int, seed: int) -> Batch:
        from attnlab.data import batch_tokens

        x, y = batch_tokens(tokens, off, self.cfg.data.seq_len)
        rng = None if self.objective == "causal_lm" else corruption_rng(seed, step, k)
        batch = make_batch(
            self.objective,
            x,
            y,
            rng,
            vocab=self.vocab,
            mask_prob=self.cfg.train.mask_prob,
            eos_id=self.eos_id,
        )
        return batch.to(self.device)

    @torch.no_grad()
    def evaluate(self) -> float:
        """Token-weighted mean loss over the fixed validation sequences (same for every run)."""
        model, dist = self.eval_model, self.dist
        was_training = self.raw.training
        self.raw.eval()
        total = torch.zeros(2, dtype=torch.float64, device=self.device)
        for i in range(len(self.val_offsets)):
            if not self.fsdp and i % dist.world != dist.rank:
                continue  # DDP: ranks split the batches; FSDP: every rank runs every forward
            batch = self._batch(self.data.val, self.val_offsets[i], 0, i, batches.EVAL_SEED)
            with self.precision.autocast():
                out = _forward(model, batch)
            n = batch.n_targets
            total[0] += out.loss.double() * n
            total[1] += n
        if not self.fsdp:
            dist.sum(total)
        self.raw.train(was_training)
        return float(total[0] / total[1])

    def _train_step(self, step: int) -> tuple[float, float]:
        """One optimizer step's forward/backward passes; returns (loss, pre-clip grad norm)."""
        A, scaler = self.accum, self.precision.scaler
        loss_sum = torch.zeros((), dtype=torch.float32, device=self.device)
        for m in range(A):
            batch = self._micro_batch(step, self.dist.rank * A + m)
            with _grad_sync(self.model, m == A - 1), self.precision.autocast():
                out = _forward(self.model, batch)
                objective = out.total_loss / A
            (scaler.scale(objective) if scaler else objective).backward()
            loss_sum += out.loss.detach().float()
        loss = self.dist.mean(loss_sum / A)
        if scaler:
            scaler.unscale_(self.optimizer)
        clip = self.cfg.train.grad_clip if self.cfg.train.grad_clip > 0 else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, clip)
        return float(loss.item()), _as_float(grad_norm)

    def _optimizer_step(self) -> None:
        if self.precision.scaler:
            self.precision.scaler.step(self.optimizer)
            self.precision.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _save(self, st: _State, monitor: DivergenceMonitor) -> None:
        model_sd, optim_sd = _state_dicts(self.raw, self.optimizer, self.fsdp)
        rngs = self.dist.all_gather(checkpoint.rng_state())
        if self.dist.is_main:
            state = {
                "tokens": st.tokens,
                "elapsed": st.elapsed,
                "train_time": st.train_time,
                "best_val_loss": st.best_val_loss,
                "last_val_loss": st.last_val_loss,
                "last_loss": st.last_loss,
                "monitor": monitor.state_dict(),
                "rng": rngs,
                "schedule_hash": self.schedule.hash,
                "world_size": self.dist.world,
                "torch_version": torch.__version__,
                "attnlab_version": attnlab.__version__,
            }
            checkpoint.write_checkpoint(self.run_dir, st.step, model_sd, optim_sd, state)
        self.dist.barrier()

    def _status(self, st: _State, status: str, **extra: Any) -> dict[str, Any]:
        tps = st.tokens / st.train_time if st.train_time > 0 else 0.0
        out = {
            "status": status,
            "step": st.step,
            "max_steps": self.cfg.train.max_steps,
            "reason": None,
            "last_loss": st.last_loss,
            "final_val_loss": st.last_val_loss,
            "best_val_loss": st.best_val_loss,
            "tokens": st.tokens,
            "elapsed": st.elapsed,
            "tokens_per_s": tps,
            "schedule_hash": self.schedule.hash,
            "val_schedule_hash": self.val_schedule.hash,
            **self.meta,
            "updated": time.time(),
            **extra,
        }
        if self.dist.is_main:
            rundir.write_status(self.run_dir, out)
        return out

    def _emit(self, kind: str, st: _State, **kw: Any) -> None:
        if self.progress is not None:
            self.progress(
                ProgressEvent(
                    kind=kind,  # type: ignore[arg-type]
                    step=st.step,
                    max_steps=self.cfg.train.max_steps,
                    tokens=st.tokens,
                    elapsed=st.elapsed,
                    **kw,
                )
            )

    # ---------------------------------------------------------------------------------- loop

    def run(self, resume: bool, stop_after: int | None) -> RunResult:
        done = self._check_existing(resume)
        if done is not None:
            return done
        self._setup_data()
        self._setup_model()
        st, monitor, resumed_from = self._resume()
        cfg, t, dist = self.cfg, self.cfg.train, self.dist
        peak = measure_peak_flops(self.device, self.precision.dtype or torch.float32)
        self.meta = {
            "objective": self.objective,
            "data_dir": str(self.data_dir),
            "world_size": dist.world,
            "parallel": t.parallel if dist.enabled else "none",
            "grad_accum": self.accum,
            "global_batch": self.global_batch,
            "tokens_per_step": self.tokens_per_step,
            "n_params": self.n_params,
            "flops_per_token": self.flops_per_token,
            "peak_flops": peak,
            "device": str(self.device),
            "dtype": self.precision.name,
            "deterministic": t.deterministic,
            "resumed_from": resumed_from,
            "torch_version": torch.__version__,
        }
        metrics = None
        if dist.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / rundir.CONFIG_FILE).write_text(dump_toml(cfg), encoding="utf-8")
            metrics = rundir.MetricsLog(self.run_dir, keep_through_step=st.step)
        try:
            self._status(st, "running")
            return self._loop(st, monitor, peak, stop_after, metrics)
        except BaseException as e:
            reason = (
                "interrupted" if isinstance(e, KeyboardInterrupt) else f"{type(e).__name__}: {e}"
            )
            self._status(st, "failed", reason=reason)
            raise
        finally:
            if metrics is not None:
                metrics.close()

    def _loop(
        self,
        st: _State,
        monitor: DivergenceMonitor,
        peak: float,
        stop_after: int | None,
        metrics: rundir.MetricsLog | None,
    ) -> RunResult:
        t, dist = self.cfg.train, self.dist
        self.raw.train()
        self._emit("start", st, message=f"{self.n_params / 1e6:.2f}M params, {self.objective}")
        session_start = time.perf_counter() - st.elapsed
        log_tokens, log_time = 0, 0.0
        status, reason = "finished", None
        while st.step < t.max_steps:
            step = st.step
            lr = lr_at(
                step, lr=t.lr, min_lr=t.min_lr, warmup_steps=t.warmup_steps, max_steps=t.max_steps
            )
            set_lr(self.optimizer, lr)
            t0 = time.perf_counter()
            loss, grad_norm = self._train_step(step)
            reason = monitor.check(loss, grad_norm)
            if reason is not None:
                self.optimizer.zero_grad(set_to_none=True)
                status = "diverged"
                st.elapsed = time.perf_counter() - session_start
                if metrics is not None:
                    metrics.append(
                        {
                            "step": step + 1,
                            "loss": loss,
                            "lr": lr,
                            "grad_norm": grad_norm,
                            "tokens": st.tokens,
                            "elapsed": st.elapsed,
                            "diverged": reason,
                        }
                    )
                break
            self._optimizer_step()
            dt = time.perf_counter() - t0
            st.step, st.tokens, st.last_loss = step + 1, st.tokens + self.tokens_per_step, loss
            st.train_time += dt
            log_tokens += self.tokens_per_step
            log_time += dt
            val = None
            if st.step % t.eval_every == 0 or st.step == t.max_steps:
                val = self.evaluate()
                st.last_val_loss = val
                st.best_val_loss = val if st.best_val_loss is None else min(st.best_val_loss, val)
            st.elapsed = time.perf_counter() - session_start
            remaining = (t.max_steps - st.step) * (st.train_time / max(st.step, 1))
            tps = log_tokens / log_time if log_time > 0 else 0.0
            is_log = st.step % t.log_every == 0 or st.step == 1 or st.step == t.max_steps
            if metrics is not None and (is_log or val is not None):
                row = {
                    "step": st.step,
                    "loss": loss,
                    "lr": lr,
                    "grad_norm": grad_norm,
                    "tokens": st.tokens,
                    "tokens_per_s": tps,
                    "mfu": mfu(self.flops_per_token, tps, peak, dist.world),
                    "elapsed": st.elapsed,
                }
                if val is not None:
                    row["val_loss"] = val
                metrics.append(row)
            if is_log:
                log_tokens, log_time = 0, 0.0
            self._emit(
                "eval" if val is not None else "step",
                st,
                loss=loss,
                val_loss=val,
                lr=lr,
                tokens_per_s=tps or None,
                eta_s=remaining,
            )
            if st.step % t.checkpoint_every == 0 or st.step == t.max_steps:
                self._save(st, monitor)
                self._status(st, "running")
            if stop_after is not None and st.step >= stop_after and st.step < t.max_steps:
                self._emit("end", st, message="stopped early")
                return _run_result(self.run_dir, self._status(st, "running"), False)
        st.elapsed = time.perf_counter() - session_start
        if status == "diverged":
            final = self._status(st, "diverged", reason=reason, step=st.step + 1)
            self._emit("end", st, message=f"diverged: {reason}")
        else:
            final = self._status(st, "finished")
            self._emit("end", st, val_loss=st.last_val_loss, eta_s=0.0, message="finished")
        return _run_result(self.run_dir, final, False)
