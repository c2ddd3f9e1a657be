"""From-scratch pretraining (SPEC 2.1): ``train(cfg, run_dir) -> RunResult``.

This module is the pretraining protocol: it builds the model from ``cfg.model``, reads micro-batch
``k = rank * A + m`` of step ``s`` from the fixed schedule (corrupted by the objective with an RNG
seeded by ``(seed, s, k)``), scores the fixed validation sequences, and hands those pieces to the
shared loop of :mod:`attnlab.runs.loop` (lr schedule, precision, accumulation, clipping,
divergence, metrics, checkpoints, exact resume). Under ``torchrun`` every rank calls :func:`train`;
rank 0 locks the run directory, checks the config against the checkpoint's and writes every file.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from attnlab.base.advice import restart
from attnlab.base.errors import UserError
from attnlab.config import Config, dump_toml
from attnlab.data.integrity import check_ids
from attnlab.model.engine.compile_cost import use_inductor_cache
from attnlab.parts import families
from attnlab.parts.family import NEIGHBOURS
from attnlab.runs import checkpoint, lock, rundir
from attnlab.runs.determinism import deterministic_mode
from attnlab.runs.device import resolve_device, resolve_precision
from attnlab.runs.distributed import Dist, setup, split, tied_state, wrap
from attnlab.runs.loop import Loop, LoopSettings, TrainTask
from attnlab.runs.optim import keep_kernels, recipe_optimizer
from attnlab.runs.peak import measure_peak_flops
from attnlab.runs.progress import ProgressFn
from attnlab.runs.records import ConfigRecord
from attnlab.runs.trackers import RunInfo, check_clients
from attnlab.train import batches
from attnlab.train.objectives import (
    Batch,
    Objective,
    corruption_rng,
    corrupts,
    extra_ids,
    make_batch,
    resolve_objective,
)
from attnlab.train.plugin_resume import plugin_change


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


def run_info(cfg: Config, run_dir: Path) -> RunInfo:
    """The trackers' labels of a run: a compare run is ``VARIANT-seedK`` in its experiment's
    group, with the variant as job type; a lone run is named by its directory."""
    e = cfg.experiment
    name = f"{e.variant}-{Path(run_dir).name}" if e.variant else Path(run_dir).name
    return RunInfo(
        run_dir=Path(run_dir),
        name=name,
        group=e.name,
        job_type=e.variant or "train",
        config=cfg.to_dict(),
        tags=list(e.tags),
    )


def _forward(model: nn.Module, batch: Batch):
    """Loss only: the LM head and cross-entropy run chunked, without the [B, T, V] logits."""
    return model(batch.input_ids, batch.targets, return_logits=False, **batch.inputs)


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
        max_steps=int(status.get("max_steps") or 0),
        final_val_loss=status.get("final_val_loss"),
        best_val_loss=status.get("best_val_loss"),
        final_loss=status.get("last_loss"),
        tokens=int(status.get("tokens", 0)),
        wall_time=float(status.get("elapsed", 0.0)),
        tokens_per_s=float(status.get("tokens_per_s") or 0.0),
        schedule_hash=str(status.get("schedule_hash") or ""),
        reason=status.get("reason"),
        resumed_from=status.get("resumed_from"),
        already_done=already_done,
    )


def _on_main(dist: Dist, fn, *args: Any) -> Any:
    """``fn(*args)`` on rank 0; its result (or its UserError, re-raised) on every rank."""
    outcome: tuple[str, Any] = ("ok", None)
    if dist.is_main:
        try:
            outcome = ("ok", fn(*args))
        except UserError as e:
            if not dist.enabled:
                raise
            outcome = ("error", str(e))
    kind, value = dist.broadcast(outcome)
    if kind == "error":
        raise UserError(value)
    return value


# --------------------------------------------------------------------------------------- train


def train(
    cfg: Config,
    run_dir: str | Path,
    *,
    progress: ProgressFn | None = None,
    resume: bool = True,
    allow_plugin_change: bool = False,
    tp: int = 1,
    _stop_after: int | None = None,
) -> RunResult:
    """Train ``cfg`` into ``run_dir``, resuming from its newest intact checkpoint.

    ``progress`` receives :class:`~attnlab.runs.progress.ProgressEvent` on rank 0 (None: silent).
    ``resume=False`` deletes the run's previous progress first. Resuming with a plugin whose
    source changed since the run recorded it (``plugins.json``) is refused unless
    ``allow_plugin_change``, which ``plugins.json`` then records in its ``history``. A finished or diverged run is not
    trained again; its stored result is returned. The run directory is locked for the call: a
    second process on it fails at once (:class:`~attnlab.runs.lock.DirectoryLockedError`). Under
    ``torchrun`` every rank calls this; only rank 0 writes files. The caller's RNG state and thread
    count are restored on return. ``tp`` > 1 (``--tp``, under ``torchrun`` only) splits each model
    copy over that many ranks by tensor parallelism (:mod:`attnlab.model.tensor_parallel`); it is
    not part of the config, so a run resumes under another ``tp`` (checkpoints hold whole
    tensors). ``_stop_after`` (tests) returns after that many steps as if the process had been
    killed.
    """
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"--out {run_dir} is a file; give a directory for the run")
    dist = setup(cfg.train.device, tp)
    threads = torch.get_num_threads()
    locked = False
    try:
        local_rank = dist.local_rank if dist.enabled else None
        device = resolve_device(cfg.train.device, local_rank=local_rank, setting="train.device")
        _on_main(dist, lock.acquire, run_dir)
        locked = dist.is_main
        forked = [device.index or 0] if device.type == "cuda" else []
        with (
            torch.random.fork_rng(devices=forked),
            deterministic_mode(cfg.train.deterministic, device),
        ):
            if cfg.train.threads:
                torch.set_num_threads(cfg.train.threads)
            task = _Pretraining(cfg, run_dir, dist, device, progress)
            task.allow_plugin_change = allow_plugin_change
            return task.run(resume, _stop_after)
    finally:
        if locked:
            lock.release(run_dir)
        torch.set_num_threads(threads)
        dist.close()


class _Pretraining(TrainTask):
    """One call of :func:`train`: the pretraining side of the shared loop."""

    def __init__(
        self,
        cfg: Config,
        run_dir: Path,
        dist: Dist,
        device: torch.device,
        progress: ProgressFn | None,
    ) -> None:
        self.run_dir, self.dist, self.device = run_dir, dist, device
        self.progress = progress
        self.precision = resolve_precision(cfg.train.dtype, device)
        self.data_dir = batches.resolve_data_dir(cfg)
        self.given_cfg = cfg
        self.cfg = cfg.model_copy(deep=True)
        self.cfg.data.dir = str(self.data_dir)
        self.config = ConfigRecord(file=rundir.CONFIG_FILE, text=dump_toml(self.cfg))
        #: FSDP2 over the model copies ("dp"); with --tp it is always FSDP2 (see runs.distributed)
        self.fsdp = dist.data_world > 1 and (cfg.train.parallel == "fsdp" or dist.tp > 1)
        #: every rank holds a share of the weights: each runs every forward, state dicts gathered
        self.sharded = self.fsdp or dist.tp > 1
        self.allow_plugin_change = False
        self.plugin_change: tuple[int | None, str] = (None, "")  # (up to step, how allowed)

    # ---------------------------------------------------------------------------- run setup

    def _existing(self, resume: bool) -> dict[str, Any] | None:
        """(rank 0) ``--restart`` clean-up, the config check, and the stored status of a run that
        is over."""
        rundir.claim_run(self.run_dir)  # never a folder attnlab did not write
        if not resume:  # --restart: deletes only after every check has passed (run())
            rundir.check_clearable(self.run_dir)
            return None
        rundir.reconcile_config(self.run_dir, self.config.text, upgrade=rundir.in_todays_keys)
        status = rundir.read_status(self.run_dir) or {}
        if status.get("status") in rundir.FINAL_STATES:
            return status
        self._check_plugin_sources()
        return None

    def _check_plugin_sources(self) -> None:
        """Refuse to resume with a plugin whose source changed, unless allowed (then recorded:
        ``plugins.json``'s history): :func:`attnlab.train.plugin_resume.plugin_change`."""
        change = plugin_change(self.run_dir, self.allow_plugin_change)
        if change is not None:
            self.plugin_change = change

    def _setup_data(self) -> None:
        from attnlab.data import TokenData, get_schedule

        cfg, dist = self.cfg, self.dist
        if dist.is_main:
            batches.prepare_if_missing(self.given_cfg, self.data_dir)
        dist.barrier()
        self.data = TokenData.open(self.data_dir)
        self.data.verify()  # sizes, sha256 when changed (cached), vocab_size vs the tokenizer
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
        self.plan = t.batch_plan(seq_len, dist.data_world)  # the ranks of one copy share a batch
        self.accum = self.plan.accum
        self.global_batch = self.plan.sequences
        self.tokens_per_step = self.plan.tokens

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
        self.schedule_hash = self.schedule.hash
        self.offsets = np.asarray(self.schedule.offsets)
        self.val_offsets = np.asarray(self.val_schedule.offsets)
        self.database = None
        if families.of(cfg.model).needs(NEIGHBOURS):
            self.database = batches.open_database(cfg, self.data_dir, dist)

    def _setup_model(self) -> None:
        from attnlab.model import build_model

        cfg = self.cfg
        torch.manual_seed(cfg.train.seed)
        self.raw = build_model(cfg.model)
        self.init_note = ""
        if cfg.train.init_from and checkpoint.newest_state(self.run_dir) is None:
            from attnlab.hf.init_from import load_pretrained

            report = load_pretrained(cfg.train.init_from, self.raw)
            self.init_note = f", from {report.spec} ({len(report.loaded)} tensors)"
            if report.fresh:
                warnings.warn(
                    f"--init-from {report.spec}: {len(report.fresh)} parameters are not in the "
                    f"checkpoint and keep attnlab's init: {', '.join(report.fresh[:8])}",
                    stacklevel=1,
                )
        self.raw = self.raw.to(self.device)
        # dropout masks differ across model copies, and agree within the tp ranks of one copy
        torch.manual_seed(cfg.train.seed + self.dist.data_rank)
        self.n_params = _n_params(self.raw)
        fpt = getattr(self.raw, "flops_per_token", None)
        self.flops_per_token = (
            float(fpt(cfg.data.seq_len)) if callable(fpt) else 2.0 * self.n_params
        )
        self.tp_lines = split(self.raw, self.dist)  # --tp: W_Q/K/V, W_O, the MLP... split
        if self.fsdp:  # shards in place; the optimizer below then holds the local shards
            wrap(self.raw, "fsdp", self.dist, self.device)
        #: the model is compiled: the loop reports its first step apart (``first_step_s``)
        self.compiles = bool(cfg.train.compile)
        if self.compiles:
            use_inductor_cache()  # a second run's first step reads the kernels from disk
        core = torch.compile(self.raw) if cfg.train.compile else self.raw
        self.eval_model = core  # DDP: evaluate without its hooks; FSDP: every rank runs it
        self.model = wrap(core, "ddp", self.dist, self.device) if not self.fsdp else core
        self.optimizer = recipe_optimizer(self.raw, cfg.train, self.device)
        self.params = [p for g in self.optimizer.param_groups for p in g["params"]]

    # ----------------------------------------------------------------------- the task's side

    def _batch(self, tokens, off: np.ndarray, step: int, k: int, seed: int) -> Batch:
        from attnlab.data import batch_tokens

        nbr = None
        if self.database is not None:  # chunks start at multiples of m (RETRO's chunk grid)
            split = "val" if tokens is self.data.val else "train"
            off, nbr = batches.chunk_neighbours(self.database, self.data, split, off, self.cfg)
        x, y = batch_tokens(tokens, off, self.cfg.data.seq_len)
        split = "train.bin" if tokens is self.data.train else "val.bin"
        check_ids(y, self.vocab, f"{self.data_dir / split}")  # one max() per batch
        check_ids(x[:, :1], self.vocab, f"{self.data_dir / split}")
        rng = corruption_rng(seed, step, k) if corrupts(self.objective) else None
        batch = make_batch(
            self.objective,
            x,
            y,
            rng,
            vocab=self.vocab,
            mask_prob=self.cfg.train.mask_prob,
            eos_id=self.eos_id,
            model=self.cfg.model,
        )
        if nbr is not None:
            batch.neighbours = torch.from_numpy(nbr)
        return batch.to(self.device)

    def micro_loss(self, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        k = self.dist.data_rank * self.accum + micro
        off = batches.micro_offsets(self.offsets, step, k, self.cfg.train.batch_size)
        out = _forward(self.model, self._batch(self.data.train, off, step, k, self.cfg.train.seed))
        return out.total_loss, out.loss

    @torch.no_grad()
    def evaluate(self) -> float:
        """Token-weighted mean loss over the fixed validation sequences (same for every run)."""
        model, dist = self.eval_model, self.dist
        was_training = self.raw.training
        self.raw.eval()
        total = torch.zeros(2, dtype=torch.float64, device=self.device)
        for i in range(len(self.val_offsets)):
            if not self.sharded and i % dist.world != dist.rank:
                continue  # DDP: ranks split the batches; FSDP, TP: every rank runs every forward
            batch = self._batch(self.data.val, self.val_offsets[i], 0, i, batches.EVAL_SEED)
            with self.precision.autocast():
                out = _forward(model, batch)
            n = batch.n_targets
            total[0] += out.loss.double() * n
            total[1] += n
        if not self.sharded:
            dist.sum(total)
        self.raw.train(was_training)
        return float(total[0] / total[1])

    def state_dicts(self) -> tuple[dict, dict]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        # sharded (FSDP2, --tp): gathered into the whole tensors one process writes, so a
        # checkpoint is the same file whatever the split it was written under
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True) if self.sharded else None
        model_sd, optim_sd = get_state_dict(self.raw, self.optimizer, options=opts)
        return tied_state(self.raw, model_sd), optim_sd

    def load_state_dicts(self, ckpt: checkpoint.Checkpoint) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        opts = StateDictOptions(full_state_dict=True) if self.sharded else None
        try:
            set_state_dict(
                self.raw,
                self.optimizer,
                model_state_dict=ckpt.model,
                optim_state_dict=ckpt.optim,
                options=opts,
            )
            keep_kernels(self.optimizer)
        except (RuntimeError, KeyError, ValueError) as e:
            raise UserError(
                f"checkpoint {ckpt.path} does not fit this model ({e}); was the model code "
                f"changed? To train this config anyway, {restart()}"
            ) from None

    # ---------------------------------------------------------------------------------- run

    def run(self, resume: bool, stop_after: int | None) -> RunResult:
        done = _on_main(self.dist, self._existing, resume)
        if done is not None:
            return _run_result(self.run_dir, done, already_done=True)
        self._setup_data()
        if not resume:
            _on_main(self.dist, rundir.clear_run, self.run_dir)
        self._setup_model()
        t, dist = self.cfg.train, self.dist
        settings = LoopSettings.from_recipe(t, self.plan)
        meta = {
            "objective": self.objective,
            "data_dir": str(self.data_dir),
            "val_schedule_hash": self.val_schedule.hash,
            "world_size": dist.world,
            "parallel": dist.describe(t.parallel),
            "tensor_parallel": dist.tp,
            "grad_accum": self.accum,
            "global_batch": self.global_batch,
            "tokens_per_step": self.tokens_per_step,
            "n_params": self.n_params,
            "flops_per_token": self.flops_per_token,
            "device": str(self.device),
            "dtype": self.precision.name,
            "deterministic": t.deterministic,
            "torch_version": torch.__version__,
        }
        if self.database is not None:  # the database is data, not parameters: recorded here
            db = self.database.meta
            meta["retrieval_database"] = {
                "directory": str(self.database.directory),
                "chunks": db["database_chunks"],
                "tokens": db["database_tokens"],
                "embedder": db["embedder"],
                "sha256": db["files"],
            }
        loop = Loop(
            self,
            settings,
            run_dir=self.run_dir,
            dist=dist,
            device=self.device,
            precision=self.precision,
            config=self.config,
            meta=meta,
            progress=self.progress,
            loggers=t.loggers,
            run_info=run_info(self.cfg, self.run_dir),
        )
        loop.resume()
        peak = measure_peak_flops(self.device, self.precision.compute_dtype)
        check_clients(t.loggers)  # a missing tracker client: nothing of the run written yet
        if dist.is_main:
            rundir.write_config(self.run_dir, self.config.text)
            step, how = self.plugin_change
            rundir.write_plugins(self.run_dir, self.cfg.plugins, replaced_at=step, how=how)
        result = loop.run(
            peak_flops=peak,
            stop_after=stop_after,
            start=f"{self.n_params / 1e6:.2f}M params, {self.objective}{self.init_note}"
            + "".join(f"\n{line}" for line in self.tp_lines),
        )
        return _run_result(self.run_dir, result.status, already_done=False)
