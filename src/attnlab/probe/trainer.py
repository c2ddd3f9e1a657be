"""Train one probe method: ``train_probe(cfg, run_dir) -> ProbeResult``.

This module is the probe protocol's side of the shared loop (:mod:`attnlab.runs.loop`): the model
is a frozen Hugging Face base with injected / LoRA tensors (only those train; the base is never
saved), micro-batch ``m`` of step ``s`` is rows ``[m b, (m + 1) b)`` (``b = train.batch_size``) of
row ``s`` of the stored batch schedule (``train.plan.sequences`` sequences of ``seq_len + 1``
tokens), the loss is the next-token cross-entropy, and the optional in-training validation loss
scores fixed windows. The recipe is the shared one (:mod:`attnlab.recipe`). Everything else
(warmup + cosine lr, AdamW grouping, precision with float16 loss scaling, accumulation,
clipping, the NaN/inf/spike divergence monitor, metrics, checkpoints and the exact resume) is the
shared loop's. The model runs in train mode, so a base's own dropout (GPT-2: 0.1; Pythia, Llama:
0) is active, as under the Hugging Face ``Trainer``.

A rerun with the same config continues at the next step; a finished run is not retrained: missing
evaluation tasks are added to it. The run directory is locked for the call.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.base.errors import UserError
from attnlab.probe import artifacts
from attnlab.probe.build import BaseProvider, ProbedModel, build_probed_model
from attnlab.probe.config import ProbeConfig, dump_probe_toml
from attnlab.probe.data import probe_data, train_schedule
from attnlab.probe.evaluation import evaluate_probe, result_key, validation_loss
from attnlab.probe.layer_stats import FOLDER as LAYER_STATS
from attnlab.probe.layer_stats import write_layer_stats
from attnlab.probe.moved_keys import upgrade_recorded
from attnlab.runs import checkpoint, lock, rundir
from attnlab.runs.determinism import deterministic_mode
from attnlab.runs.device import Precision, resolve_device, resolve_precision
from attnlab.runs.distributed import Dist
from attnlab.runs.loop import Loop, LoopResult, LoopSettings, TrainTask
from attnlab.runs.optim import recipe_optimizer
from attnlab.runs.progress import ProgressEvent
from attnlab.runs.records import ConfigRecord
from attnlab.runs.trackers import RunInfo

Log = Callable[[str], None]
# keys a rerun may change without invalidating the trained adapter
UNCHECKED = ("eval", "name", "train.loggers")


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
    #: the injected parts' declared statistics: key -> one value per layer
    layer_stats: dict[str, list[float | None]] = field(default_factory=dict)
    final_loss: float | None = None
    reason: str = ""
    #: per statistic, its part's sentence on what it measures
    layer_stats_doc: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


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


def probe_optimizer(probed: ProbedModel, cfg: ProbeConfig, device: torch.device):
    """AdamW over the trainable tensors with the engine's grouping (decay on >= 2-D only)."""
    return recipe_optimizer(probed.model, cfg.train, device)


def lm_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (float32 logits) of ``x`` against ``y`` (the caller picks
    the autocast)."""
    logits = model(input_ids=x).logits
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())


# ----------------------------------------------------------------------------------- run dir


PROBE_KIND = "probe"  # the kind in a probe run directory's marker


def claim_probe_run(run_dir: Path) -> None:
    """Mark ``run_dir`` as attnlab's probe run directory, or refuse one that holds files attnlab
    did not write, naming them; an unmarked directory an earlier attnlab wrote (it has the
    probe's recorded ``probe.toml``) is accepted (:func:`attnlab.base.owned.claim`)."""
    from attnlab.base.owned import claim

    claim(
        run_dir,
        PROBE_KIND,
        what="probe run directory",
        legacy=lambda d: (d / artifacts.PROBE_TOML).is_file(),
    )


def clear_run(run_dir: Path) -> None:
    """Delete the files a probe run writes (for ``--restart``); nothing else is touched.
    Refuses, deleting nothing, when ``checkpoints/`` holds anything a checkpoint writer did not
    make."""
    from attnlab.base.owned import keep_if_edited

    rundir.check_clearable(run_dir)
    keep_if_edited(run_dir, artifacts.PROBE_TOML, rundir.known_configs(run_dir))  # edits: kept
    for name in (
        checkpoint.CHECKPOINTS,
        artifacts.LORA_DIR,
        LAYER_STATS,
        "eval",
    ):
        shutil.rmtree(run_dir / name, ignore_errors=True)
    for name in (
        artifacts.PROBE_JSON,
        artifacts.PROBE_TOML,
        artifacts.ADAPTER,
        rundir.STATUS_FILE,
        rundir.METRICS_FILE,
    ):
        (run_dir / name).unlink(missing_ok=True)


def check_or_write_config(run_dir: Path, cfg: ProbeConfig) -> ConfigRecord:
    """Refuse to resume a run trained with another recipe (the checkpoint's recorded config
    decides; a damaged ``probe.toml`` is repaired from it), then write ``probe.toml``."""
    record = ConfigRecord(file=artifacts.PROBE_TOML, text=dump_probe_toml(cfg))
    rundir.reconcile_config(
        run_dir, record.text, file=record.file, unchecked=UNCHECKED, upgrade=upgrade_recorded
    )
    rundir.write_config(run_dir, record.text, file=record.file)
    rundir.write_plugins(run_dir, cfg.plugins)
    return record


# ----------------------------------------------------------------------------- the loop's side


class ProbeTask(TrainTask):
    """The frozen probe as a :class:`~attnlab.runs.loop.TrainTask`."""

    def __init__(
        self, cfg: ProbeConfig, probed: ProbedModel, data: Any, precision: Precision
    ) -> None:
        t = cfg.train
        self.cfg, self.probed, self.data, self.precision = cfg, probed, data, precision
        self.device = next(probed.model.parameters()).device
        schedule = train_schedule(cfg, data)
        self.offsets = schedule.offsets
        self.schedule_hash = schedule.hash
        if t.gradient_checkpointing:
            enable_gradient_checkpointing(probed.model)
        self.raw = self.model = probed.model
        self.optimizer = probe_optimizer(probed, cfg, self.device)
        self.params = [p for _, p in probed.trainable()]

    def micro_loss(self, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        from attnlab.data import batch_tokens

        t = self.cfg.train
        off = self.offsets[step][micro * t.batch_size : (micro + 1) * t.batch_size]
        x, y = batch_tokens(self.data.train, off, t.seq_len)
        loss = lm_loss(
            self.model, torch.from_numpy(x).to(self.device), torch.from_numpy(y).to(self.device)
        )
        return loss, loss

    def evaluate(self) -> float:
        t = self.cfg.train
        return validation_loss(
            self.model,
            self.data,
            t.seq_len,
            self.cfg.eval.val_sequences,
            t.batch_size,
            self.precision.autocast,
        )

    def state_dicts(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        return {n: p.detach() for n, p in self.probed.trainable()}, self.optimizer.state_dict()

    def load_state_dicts(self, ckpt: checkpoint.Checkpoint) -> None:
        params = dict(self.probed.trainable())
        missing = sorted(set(params) - set(ckpt.model))
        if missing or set(ckpt.model) - set(params):
            raise UserError(
                f"{ckpt.path} does not hold this method's tensors (missing {missing[:3]})"
            )
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(ckpt.model[n])
        assert ckpt.optim is not None
        osd = {"state": {int(k): v for k, v in ckpt.optim["state"].items()}}
        osd["param_groups"] = ckpt.optim["param_groups"]
        try:
            self.optimizer.load_state_dict(osd)
        except (ValueError, KeyError) as e:
            raise UserError(
                f"{ckpt.path} holds optimizer state for other tensors ({e}); rerun with --restart"
            ) from None


def _reporter(label: str, log: Log, log_every: int) -> Callable[[ProgressEvent], None]:
    def report(ev: ProgressEvent) -> None:
        if ev.kind == "start" and ev.step:
            log(f"[{label}] resuming at step {ev.step}/{ev.max_steps}")
        elif ev.kind in ("step", "eval") and (
            ev.step % log_every == 0 or ev.step == ev.max_steps or ev.val_loss is not None
        ):
            val = f" val {ev.val_loss:.4f}" if ev.val_loss is not None else ""
            log(f"[{label}] step {ev.step}/{ev.max_steps} loss {ev.loss:.4f}{val} lr {ev.lr:.2e}")
        elif ev.kind == "end" and ev.message.startswith("diverged"):
            log(f"[{label}] {ev.message}")

    return report


def _train_loop(
    cfg: ProbeConfig,
    run_dir: Path,
    probed: ProbedModel,
    data: Any,
    record: ConfigRecord,
    log: Log,
    meta: dict[str, Any],
) -> LoopResult:
    t = cfg.train
    device = next(probed.model.parameters()).device
    precision = resolve_precision(t.dtype, device)
    task = ProbeTask(cfg, probed, data, precision)
    # the end's evaluation is evaluate_probe's perplexity, not the loop's validation loss
    settings = LoopSettings.from_recipe(t, t.plan, eval_at_end=False)
    loop = Loop(
        task,
        settings,
        run_dir=run_dir,
        dist=Dist(),
        device=device,
        precision=precision,
        config=record,
        meta=meta | {"dtype": precision.name, "device": str(device)},
        progress=_reporter(cfg.label, log, t.log_every),
        loggers=t.loggers,
        run_info=RunInfo(
            run_dir=run_dir,
            name=cfg.label,
            group=f"probe {cfg.base.model}",
            job_type="probe",
            config=cfg.model_dump(mode="json"),
        ),
    )
    loop.resume()
    return loop.run()


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
    with lock.locked(run_dir, "probe run directory"):
        claim_probe_run(run_dir)  # before anything is written or deleted
        return _train_probe(cfg, run_dir, base, restart, data_root, log)


def _train_probe(
    cfg: ProbeConfig,
    run_dir: Path,
    base: BaseProvider,
    restart: bool,
    data_root: str | Path,
    log: Log,
) -> ProbeResult:
    if restart:
        clear_run(run_dir)
    record = check_or_write_config(run_dir, cfg)
    label = cfg.label
    status = rundir.read_status(run_dir) or {}
    if status.get("status") in rundir.FINAL_STATES and (run_dir / artifacts.PROBE_JSON).is_file():
        return _rerun_finished(cfg, run_dir, status, data_root, log)
    t = cfg.train
    if t.threads:
        torch.set_num_threads(t.threads)
    device = resolve_device(t.device, setting="train.device")
    probed = build_probed_model(cfg, device, base)
    counts = probed.counts()
    artifacts.save_probe(run_dir, probed, cfg, 0)
    log(
        f"[{label}] {probed.source.label}: method {probed.method.name}, "
        f"{counts['trainable']:,} trainable params"
    )
    data = probe_data(cfg, probed.source, probed.tokenizer, data_root)
    meta = {"method": probed.method.name}
    final: dict[str, Any] = {"status": "finished", "step": 0, **meta}
    steps, last, reason = 0, None, ""
    if counts["trainable"] and t.max_steps:
        rundir.write_status(run_dir, {"status": "running", "step": 0, **meta})
        with deterministic_mode(t.deterministic, device):
            result = _train_loop(cfg, run_dir, probed, data, record, log, meta)
        final, steps = result.status, result.counters.step
        last, reason = result.counters.last_loss, result.reason or ""
    state = final["status"]
    artifacts.save_probe(run_dir, probed, cfg, steps)
    stats = _write_layer_stats(probed, run_dir, label)
    results: dict[str, dict[str, Any]] = {}
    if state == "finished":
        probed.model.eval()
        results = evaluate_probe(probed.model, probed.tokenizer, data, cfg, run_dir)
    rundir.write_status(run_dir, final | {"final_loss": last, "params": counts})
    doc = probed.injection.layer_stats_doc() if probed.injection is not None else {}
    return ProbeResult(
        label,
        probed.method.name,
        state,
        str(run_dir),
        steps,
        counts,
        results,
        stats,
        last,
        reason,
        doc,
    )


def _write_layer_stats(
    probed: ProbedModel, run_dir: Path, label: str
) -> dict[str, list[float | None]]:
    """The injected parts' declared statistics, written as ``layer_stats/KEY.{csv,md,png}``."""
    if probed.injection is None:
        return {}
    stats = probed.injection.layer_stats()
    write_layer_stats({key: {label: values} for key, values in stats.items()}, run_dir)
    return stats


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
        device = resolve_device(cfg.train.device, setting="train.device")
        probed = artifacts.load_probed(run_dir, device)
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
        record.get("layer_stats", {}),
        status.get("final_loss"),
        status.get("reason") or "",
        record.get("layer_stats_doc", {}),
    )
