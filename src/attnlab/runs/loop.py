"""The one training loop behind pretraining (``attnlab train``) and the frozen probe.

A protocol supplies a :class:`~attnlab.runs.task.TrainTask` (what model, which batches, what validation) and the loop
does the rest, identically for both. One optimizer step ``s`` (0-based):

1. ``lr = lr_at(s)`` (linear warmup, cosine to ``min_lr``; :mod:`attnlab.runs.optim`);
2. for each of ``A`` micro-batches ``m``, under the run's precision (autocast, and a
   ``GradScaler`` for float16): ``objective / A`` is backpropagated (gradient all-reduce only on
   the last micro-batch under DDP/FSDP) and the reported loss is summed;
3. the step loss (mean over micro-batches and ranks) and the pre-clip gradient norm go to the
   :class:`~attnlab.runs.divergence.DivergenceMonitor` (NaN/inf, loss spike); a healthy step
   clips, steps the optimizer and counts ``tokens_per_step`` tokens; a diverged one stops the run
   with status ``diverged`` (an outcome, not a crash);
4. every ``eval_every`` steps (and at the end if ``eval_at_end``) the task's validation loss, every
   ``log_every`` steps a ``metrics.jsonl`` row (with the parts' declared ``train_stats`` as
   ``part/KEY/LAYER`` columns), every ``checkpoint_every`` steps a checkpoint.

Everything a step depends on is a function of the step index or lives in the checkpoint (weights,
optimizer moments, the loss scaler, per-rank RNG states, counters, the divergence statistics), so
a run killed at any point and started again reproduces the uninterrupted run bit for bit. Resuming
checks the stored batch-schedule hash and the protocol checks the config
(:func:`attnlab.runs.rundir.reconcile_config`) before anything is written.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

import attnlab
from attnlab.base.advice import restart
from attnlab.base.errors import UserError
from attnlab.parts.exits import as_error
from attnlab.parts.stats import train_stats
from attnlab.runs import checkpoint, rundir
from attnlab.runs.clipping import clip_grad_norm
from attnlab.runs.compile_stats import cache_counts, compile_seconds
from attnlab.runs.device import Precision
from attnlab.runs.distributed import Dist
from attnlab.runs.divergence import DivergenceMonitor
from attnlab.runs.optim import lr_at, set_lr
from attnlab.runs.peak import mfu
from attnlab.runs.progress import ProgressEvent, ProgressFn
from attnlab.runs.records import ConfigRecord, RngRecord
from attnlab.runs.rng import rng_state, set_rng_state
from attnlab.runs.task import Counters, LoopResult, LoopSettings, TrainTask
from attnlab.runs.trackers import RunInfo, Trackers, check_clients

__all__ = ["Counters", "Loop", "LoopResult", "LoopSettings", "TrainTask"]


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


def _rng_list(rng: list[RngRecord] | RngRecord | None) -> list[dict[str, Any]]:
    if rng is None:
        return []
    items = rng if isinstance(rng, list) else [rng]
    return [r.model_dump() for r in items]


class Loop:
    """One session of training ``task`` into ``run_dir`` (rank 0 writes every file)."""

    def __init__(
        self,
        task: TrainTask,
        settings: LoopSettings,
        *,
        run_dir: Path,
        dist: Dist,
        device: torch.device,
        precision: Precision,
        config: ConfigRecord,
        meta: dict[str, Any] | None = None,
        progress: ProgressFn | None = None,
        loggers: Sequence[str] = (),
        run_info: RunInfo | None = None,
    ) -> None:
        self.task, self.s = task, settings
        self.run_dir, self.dist, self.device, self.precision = run_dir, dist, device, precision
        self.config = config
        self.meta = dict(meta or {})
        self.progress = progress if dist.is_main else None
        self.counters = Counters()
        self.monitor = DivergenceMonitor(settings.spike_factor)
        self.resumed_from: int | None = None
        self.peak_flops = 0.0
        self.loggers = list(loggers)
        self.run_info = run_info or RunInfo(run_dir=run_dir, name=run_dir.name)
        self.trackers: Trackers | None = None

    # -------------------------------------------------------------------------------- resume

    def resume(self) -> int | None:
        """Load the newest intact checkpoint (rank 0 picks it, every rank reads it); returns its
        step, or None for a fresh start."""
        path = None
        ckpt = None
        if self.dist.is_main:
            ckpt = checkpoint.load_latest(self.run_dir)
            path = None if ckpt is None else str(ckpt.path)
        path = self.dist.broadcast(path)
        if path is None:
            return None
        if ckpt is None:
            ckpt = checkpoint.read_checkpoint(Path(path))
        st = ckpt.state
        if st.schedule_hash and st.schedule_hash != self.task.schedule_hash:
            raise UserError(
                f"the batch schedule changed since {ckpt.path} was written (hash "
                f"{st.schedule_hash[:16]} -> {self.task.schedule_hash[:16]}): the data directory "
                f"was re-prepared or the recipe's batch shape changed. Restore the data, or "
                f"{restart()}"
            )
        self.task.load_state_dicts(ckpt)
        self.counters = Counters(
            step=ckpt.step,
            tokens=st.tokens,
            elapsed=st.elapsed,
            train_time=st.train_time,
            best_val_loss=st.best_val_loss,
            last_val_loss=st.last_val_loss,
            last_loss=st.last_loss,
        )
        if st.monitor:
            self.monitor.load_state_dict(st.monitor)
        scaler_state = (st.model_extra or {}).get("grad_scaler")
        if self.precision.scaler is not None and scaler_state:
            self.precision.scaler.load_state_dict(scaler_state)
        rngs = _rng_list(st.rng)
        if len(rngs) == self.dist.world:
            set_rng_state(rngs[self.dist.rank])
        self.resumed_from = ckpt.step
        return ckpt.step

    # -------------------------------------------------------------------------------- pieces

    def _train_step(self, step: int) -> tuple[float, float]:
        """One optimizer step's forward/backward passes; returns (loss, pre-clip grad norm)."""
        A, scaler, task = self.s.accum, self.precision.scaler, self.task
        loss_sum = torch.zeros((), dtype=torch.float32, device=self.device)
        for m in range(A):
            with _grad_sync(task.model, m == A - 1), self.precision.autocast():
                objective, loss = task.micro_loss(step, m)
                objective = objective / A
            (scaler.scale(objective) if scaler else objective).backward()
            loss_sum += loss.detach().float()
        mean = self.dist.mean(loss_sum / A)
        if scaler:
            scaler.unscale_(task.optimizer)
        clip = self.s.grad_clip if self.s.grad_clip > 0 else math.inf
        grad_norm = clip_grad_norm(task.params, clip)
        self._add_grad_noise(step)
        return float(mean.item()), _as_float(grad_norm)

    def grad_noise_std(self, step: int) -> float:
        """sigma_t = sqrt(eta / (1 + t)^gamma), the gradient noise of step ``step`` (0: off)."""
        s = self.s
        return math.sqrt(s.grad_noise / (1 + step) ** s.grad_noise_decay) if s.grad_noise else 0.0

    @torch.no_grad()
    def _add_grad_noise(self, step: int) -> None:
        """g += N(0, sigma_t^2) on every trainable gradient, after clipping (Neelakantan et al.
        2015). The noise of step t comes from a generator seeded by (train.seed, t): the same on
        every rank (whose gradients are already reduced) and again after a resume, so a resumed
        run adds exactly the noise an uninterrupted one does, with no generator state to keep."""
        std = self.grad_noise_std(step)
        if not std:
            return
        gen: dict[torch.device, torch.Generator] = {}
        for p in self.task.params:
            if p.grad is None:
                continue
            if p.grad.device not in gen:
                g = torch.Generator(device=p.grad.device)
                gen[p.grad.device] = g.manual_seed(self.s.seed * 1_000_003 + step)
            noise = torch.randn(
                p.grad.shape,
                generator=gen[p.grad.device],
                device=p.grad.device,
                dtype=torch.float32,
            )
            p.grad.add_(noise.to(p.grad.dtype), alpha=std)

    def _optimizer_step(self) -> None:
        scaler, opt = self.precision.scaler, self.task.optimizer
        if scaler:
            scaler.step(opt)  # skipped (and the scale lowered) when gradients overflowed
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)

    def _save(self) -> None:
        model_sd, optim_sd = self.task.state_dicts()
        rngs = self.dist.all_gather(rng_state())
        if self.dist.is_main:
            c = self.counters
            state: dict[str, Any] = {
                "tokens": c.tokens,
                "elapsed": c.elapsed,
                "train_time": c.train_time,
                "best_val_loss": c.best_val_loss,
                "last_val_loss": c.last_val_loss,
                "last_loss": c.last_loss,
                "monitor": self.monitor.state_dict(),
                "rng": rngs,
                "schedule_hash": self.task.schedule_hash,
                "world_size": self.dist.world,
                "torch_version": torch.__version__,
                "attnlab_version": attnlab.__version__,
            }
            if self.precision.scaler is not None:
                state["grad_scaler"] = self.precision.scaler.state_dict()
            checkpoint.write_checkpoint(
                self.run_dir, c.step, model_sd, optim_sd, state, config=self.config
            )
        self.dist.barrier()

    def status(self, state: str, **extra: Any) -> dict[str, Any]:
        """Write (rank 0) and return ``status.json`` with the loop's counters and ``meta``."""
        c = self.counters
        out = {
            "status": state,
            "step": c.step,
            "max_steps": self.s.max_steps,
            "reason": None,
            "last_loss": c.last_loss,
            "final_val_loss": c.last_val_loss,
            "best_val_loss": c.best_val_loss,
            "tokens": c.tokens,
            "elapsed": c.elapsed,
            "tokens_per_s": c.tokens / c.train_time if c.train_time > 0 else 0.0,
            "schedule_hash": self.task.schedule_hash,
            "peak_flops": self.peak_flops,
            "resumed_from": self.resumed_from,
            **self.meta,
            "updated": time.time(),
            **extra,
        }
        if self.dist.is_main:
            rundir.write_status(self.run_dir, out)
        return out

    def _emit(self, kind: str, **kw: Any) -> None:
        """One progress event to the caller's reporter and to the run's trackers."""
        if self.progress is None and self.trackers is None:
            return
        c = self.counters
        ev = ProgressEvent(
            kind=kind,  # type: ignore[arg-type]
            step=c.step,
            max_steps=self.s.max_steps,
            tokens=c.tokens,
            elapsed=c.elapsed,
            **kw,
        )
        if self.progress is not None:
            self.progress(ev)
        if self.trackers is not None:
            self.trackers(ev)

    # ---------------------------------------------------------------------------------- run

    def run(
        self, *, peak_flops: float = 0.0, stop_after: int | None = None, start: str = ""
    ) -> LoopResult:
        """Train to ``max_steps`` (or until divergence); ``stop_after`` (tests) returns after
        that many steps as if the process had been killed. An exception marks the run
        ``failed`` in ``status.json`` and propagates."""
        self.peak_flops = peak_flops
        check_clients(self.loggers)  # on every rank: a missing client stops them all
        if self.dist.is_main:
            self.trackers = Trackers.open(self.loggers, self.run_info, self.config.text)
        metrics = None
        if self.dist.is_main:
            metrics = rundir.MetricsLog(self.run_dir, keep_through_step=self.counters.step)
        try:
            self.status("running")
            return self._loop(metrics, stop_after, start)
        except BaseException as e:
            # sys.exit() in a part's code: the run failed, and the command says so (never exit 0)
            exited = as_error(e, f"training {self.run_dir} (step {self.counters.step})")
            err = exited or e
            reason = (
                "interrupted"
                if isinstance(err, KeyboardInterrupt)
                else f"{type(err).__name__}: {err}"
            )
            failed = self.status("failed", reason=reason)
            if self.trackers is not None:
                self.trackers.close(failed)
            if exited is not None:
                raise exited from None
            raise
        finally:
            if metrics is not None:
                metrics.close()

    def _loop(
        self, metrics: rundir.MetricsLog | None, stop_after: int | None, start: str
    ) -> LoopResult:
        s, c, task = self.s, self.counters, self.task
        task.raw.train()
        self._emit("start", message=start)
        clock = _Clock(time.perf_counter() - c.elapsed)
        while c.step < s.max_steps:
            step = c.step
            lr = lr_at(
                step, lr=s.lr, min_lr=s.min_lr, warmup_steps=s.warmup_steps, max_steps=s.max_steps
            )
            set_lr(task.optimizer, lr)
            t0, compiled_before, cached_before = (
                time.perf_counter(),
                compile_seconds(),
                cache_counts(),
            )
            loss, grad_norm = self._train_step(step)
            # with loss scaling an overflowing gradient is routine: the scaler skips that step
            reason = self.monitor.check(loss, None if self.precision.scaler else grad_norm)
            if reason is not None:
                task.optimizer.zero_grad(set_to_none=True)
                c.elapsed = clock.elapsed()
                if metrics is not None:  # the step that diverged, not counted as trained
                    row = self._row(step + 1, loss, lr, grad_norm)
                    metrics.append({**row, "diverged": reason})
                return self._end(clock, "diverged", reason)
            self._optimizer_step()
            dt = time.perf_counter() - t0
            first = self._first_step(clock, dt, compile_seconds() - compiled_before, cached_before)
            c.step, c.tokens, c.last_loss = step + 1, c.tokens + s.tokens_per_step, loss
            c.train_time += dt
            clock.add(s.tokens_per_step, dt - first.get("compile_s", 0.0))
            val = self._evaluate_now()
            c.elapsed = clock.elapsed()
            self._log_step(metrics, clock, step, loss, lr, grad_norm, val, first)
            if c.step % s.checkpoint_every == 0 or c.step == s.max_steps:
                self._save()
                self.status("running")
            if stop_after is not None and c.step >= stop_after and c.step < s.max_steps:
                st = self.status("running")
                self._emit("end", message="stopped early", status=st)
                return LoopResult("running", st, c, self.resumed_from)
        return self._end(clock, "finished", None)

    def _first_step(
        self, clock: _Clock, dt: float, compiled: float, cached_before: tuple[int, int]
    ) -> dict[str, float]:
        """The session's first step, reported apart: its time, what compiling (the engine's
        kernels, torch.compile) took inside it (``compile_s``, left out of tokens/s) and the
        graphs inductor's on-disk cache served or missed (``fxgraph_cache_hit``/``_miss``);
        {} on later steps."""
        if clock.first_done:
            return {}
        clock.first_done = True
        if compiled <= 0 and not getattr(self.task, "compiles", False):
            return {}  # nothing compiled: the row is the plain one
        out = {"first_step_s": round(dt, 4)}
        if compiled > 0:
            out["compile_s"] = round(compiled, 4)
        hits, misses = (now - then for now, then in zip(cache_counts(), cached_before))
        if hits or misses:
            out |= {"fxgraph_cache_hit": hits, "fxgraph_cache_miss": misses}
        return out

    def _evaluate_now(self) -> float | None:
        """The validation loss when this step evaluates (every ``eval_every``, and at the end),
        kept in the counters; None on other steps."""
        s, c = self.s, self.counters
        due = (s.eval_every and c.step % s.eval_every == 0) or (
            s.eval_at_end and c.step == s.max_steps
        )
        val = self.task.evaluate() if due else None
        if val is not None:
            c.last_val_loss = val
            c.best_val_loss = val if c.best_val_loss is None else min(c.best_val_loss, val)
        return val

    def _row(self, step: int, loss: float, lr: float, grad_norm: float, **more: Any) -> dict:
        """One ``metrics.jsonl`` row: the step's numbers, then ``more``, then the time."""
        c = self.counters
        row = {"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm, "tokens": c.tokens}
        return {**row, **more, "elapsed": c.elapsed}

    def _log_step(
        self,
        metrics: rundir.MetricsLog | None,
        clock: _Clock,
        step: int,
        loss: float,
        lr: float,
        grad_norm: float,
        val: float | None,
        first: dict[str, float] | None = None,
    ) -> None:
        """A trained step's metrics row (on logging and evaluation steps) and progress event;
        ``first``: the session's first step's time and compile time, reported apart."""
        s, c, task = self.s, self.counters, self.task
        tps = clock.tokens_per_s()
        is_log = c.step % s.log_every == 0 or c.step == 1 or c.step == s.max_steps
        row: dict[str, Any] | None = None
        if is_log or val is not None:
            more: dict[str, Any] = {"tokens_per_s": tps, **(first or {})}
            if s.grad_noise:
                more["grad_noise_std"] = self.grad_noise_std(step)
            if task.flops_per_token:
                more["mfu"] = mfu(task.flops_per_token, tps, self.peak_flops, self.dist.world)
            row = self._row(c.step, loss, lr, grad_norm, **more)
            if val is not None:
                row["val_loss"] = val
            row.update(train_stats(task.raw))  # the parts' own numbers (part/KEY/LAYER)
            if metrics is not None:
                metrics.append(row)
        if is_log:
            clock.restart_window()
        self._emit(
            "eval" if val is not None else "step",
            loss=loss,
            val_loss=val,
            lr=lr,
            tokens_per_s=tps or None,
            eta_s=(s.max_steps - c.step) * (c.train_time / max(c.step, 1)),
            metrics=row,
        )

    def _end(self, clock: _Clock, state: str, reason: str | None) -> LoopResult:
        """The session's last status (``finished`` or ``diverged``) and its ``end`` event."""
        c = self.counters
        c.elapsed = clock.elapsed()
        if state == "diverged":
            final = self.status("diverged", reason=reason, step=c.step + 1)
            self._emit("end", message=f"diverged: {reason}", status=final)
        else:
            final = self.status("finished")
            self._emit("end", val_loss=c.last_val_loss, eta_s=0.0, message="finished", status=final)
        return LoopResult(state, final, c, self.resumed_from, reason)


class _Clock:
    """The session's wall clock and the tokens and time of the current logging window (the
    tokens/s a metrics row reports)."""

    def __init__(self, start: float) -> None:
        self.start, self.tokens, self.time = start, 0, 0.0
        self.first_done = False  # the session's first step was seen (its compile reported)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def add(self, tokens: int, seconds: float) -> None:
        self.tokens += tokens
        self.time += seconds

    def tokens_per_s(self) -> float:
        return self.tokens / self.time if self.time > 0 else 0.0

    def restart_window(self) -> None:
        self.tokens, self.time = 0, 0.0
