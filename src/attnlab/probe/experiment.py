"""Run every method of an experiment file into ``OUT/runs/<method>/`` and write one table.

The base is loaded once and each method trains on a deep copy, so all methods start from the
same weights; they read one data directory and one stored batch schedule (identical batches per
step) and are scored by the same evaluation. A rerun resumes unfinished methods and skips
finished ones; a method that fails is recorded (``status.json`` + ``error.txt``) and the others
still run. Outputs in ``OUT``: ``results.csv``, ``results.json``, ``report.md`` (the seed's
Table 2 shape) and, per statistic the injected parts declare (the content skip's ||W_skip||_F, a
plugin part's own), ``layer_stats/KEY.{csv,md,png}`` over every method that has it.
"""

from __future__ import annotations

import copy
import sys
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from attnlab.base.errors import UserError
from attnlab.probe.config import ProbeConfig, load_experiment
from attnlab.probe.layer_stats import collect, report_section, write_layer_stats
from attnlab.probe.report import make_row, write_report
from attnlab.probe.train_curves import train_curves_section
from attnlab.probe.trainer import ProbeResult, train_probe
from attnlab.runs import lock, rundir


class SharedBase:
    """Loads ``cfg.base`` on first use and hands out deep copies (the original stays pristine)."""

    def __init__(self, cfg: ProbeConfig) -> None:
        self.cfg = cfg
        self._loaded: tuple[Any, Any] | None = None

    def __call__(self) -> tuple[Any, Any]:
        if self._loaded is None:
            import torch

            from attnlab.probe.base import load_base, pick_dtype, resolve_base
            from attnlab.runs.device import resolve_device

            b = self.cfg.base
            device = resolve_device(self.cfg.train.device, setting="train.device")
            self._loaded = load_base(
                resolve_base(b.model, b.gguf_file, b.revision),
                dtype=pick_dtype(b.dtype, torch.device(device)),
                attn_implementation=b.attn_implementation,
            )
        model, tokenizer = self._loaded
        return copy.deepcopy(model), tokenizer


def run_dir_for(out_dir: Path, cfg: ProbeConfig) -> Path:
    return out_dir / "runs" / cfg.dir_name


def lora_note(label: str, counts: dict[str, Any]) -> str | None:
    plan = counts.get("lora_plan")
    if not plan or plan.get("budget") is None:
        return None
    actual = counts.get("trainable", 0)
    target = actual - counts.get("lora", 0) + plan["budget"]
    text = (
        f"{label}: LoRA rank {plan['rank']} solved on the actual count after get_peft_model: "
        f"{actual:,} trainable vs {target:,} for {plan['matched_to']} "
        f"({100 * (actual - target) / target:+.2f}%)."
    )
    if plan.get("naive_rank"):
        ratio = plan["naive_params"] / plan["budget"]
        text += (
            f" The formula r = N/(4dL) (two d x d targets per layer) would give rank "
            f"{plan['naive_rank']} = {plan['naive_params']:,} LoRA params ({ratio:.2f}x the budget;"
            " seed 000's r = 480 on Pythia-160M was 1.5x)."
        )
    return text


def recipe_note(cfg: ProbeConfig) -> str:
    t = cfg.train
    return (
        f"base {cfg.base.model}; corpus {cfg.data.corpus}; AdamW lr {t.lr:g} cosine to {t.min_lr:g}, "
        f"warmup {t.warmup_steps}, {t.max_steps} steps x {t.plan.sequences} seqs x {t.seq_len} tokens, "
        f"seed {t.seed}; eval limit {cfg.eval.limit}, context {cfg.eval.max_length or t.seq_len}"
    )


def result_row(r: ProbeResult) -> dict[str, Any]:
    """One table row; a LoRA method's label carries its rank, as in the seed's "LoRA (r=480)"."""
    plan = r.counts.get("lora_plan")
    label = f"{r.label} (r={plan['rank']})" if plan else r.label
    return make_row(label, int(r.counts.get("trainable", 0)), r.status, r.steps, r.results)


def _failed(cfg: ProbeConfig, run_dir: Path, err: BaseException) -> ProbeResult:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "error.txt").write_text(traceback.format_exc(), encoding="utf-8")
    reason = f"{type(err).__name__}: {err}"
    rundir.write_status(run_dir, {"status": "failed", "reason": reason})
    return ProbeResult(cfg.label, cfg.method, "failed", str(run_dir), 0, {}, reason=reason)


def run_experiment(
    path: str | Path,
    out_dir: str | Path,
    overrides: Iterable[str] = (),
    *,
    restart: bool = False,
    data_root: str | Path = "data",
    log: Callable[[str], None] | None = None,
    plugins: Iterable[str] = (),
) -> list[ProbeResult]:
    """Train and evaluate every method of the experiment file ``path`` into ``out_dir``, which
    is locked for the call (a second process on it fails at once, naming the holder)."""
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    name, configs = load_experiment(path, overrides, plugins)
    out_dir = Path(out_dir)
    with lock.locked(out_dir, "probe experiment directory"):
        claim_probe_experiment(out_dir)  # before anything is written or deleted
        return _run_methods(name, configs, out_dir, restart, data_root, log)


PROBE_EXPERIMENT_KIND = "probe-experiment"  # the kind in a probe experiment directory's marker


def claim_probe_experiment(out_dir: Path) -> None:
    """Mark ``out_dir`` as attnlab's probe experiment directory, or refuse one that holds files
    attnlab did not write, naming them; an unmarked directory an earlier attnlab wrote (its
    ``report.md`` beside method directories with a recorded ``probe.toml``) is accepted."""
    from attnlab.base.owned import claim
    from attnlab.probe.artifacts import PROBE_TOML

    def legacy(d: Path) -> bool:
        return (d / "report.md").is_file() and any(d.glob(f"*/{PROBE_TOML}"))

    claim(out_dir, PROBE_EXPERIMENT_KIND, what="probe experiment directory", legacy=legacy)


def _run_methods(
    name: str,
    configs: list[ProbeConfig],
    out_dir: Path,
    restart: bool,
    data_root: str | Path,
    log: Callable[[str], None],
) -> list[ProbeResult]:
    shared = SharedBase(configs[0])
    results: list[ProbeResult] = []
    for i, cfg in enumerate(configs):
        run_dir = run_dir_for(out_dir, cfg)
        log(f"== {name}: method {i + 1}/{len(configs)}: {cfg.label} -> {run_dir}")
        try:
            res = train_probe(
                cfg, run_dir, base=shared, restart=restart, data_root=data_root, log=log
            )
        except (UserError, KeyboardInterrupt):
            raise
        except Exception as e:  # one broken method must not lose the others' results
            log(f"[{cfg.label}] failed: {type(e).__name__}: {e}")
            res = _failed(cfg, run_dir, e)
        results.append(res)
        write_experiment_report(out_dir, name, configs[0], results)
    return results


def _train_stats_docs() -> dict[str, str]:
    """Every registered part's sentences on its training statistics (plugins included)."""
    from attnlab.parts import registry

    docs: dict[str, str] = {}
    for spec in registry.specs():
        docs.update(spec.cls.train_stats_doc())
    return docs


def write_experiment_report(
    out_dir: Path, name: str, cfg: ProbeConfig, results: list[ProbeResult]
) -> list[Path]:
    """The table (results.csv/json, report.md) and, per declared layer statistic, the combined
    table and plot (``layer_stats/``) and a report section."""
    rows = [result_row(r) for r in results]
    notes = [recipe_note(cfg)]
    notes += [n for r in results if (n := lora_note(r.label, r.counts))]
    notes += [f"{r.label}: {r.status} ({r.reason})" for r in results if r.reason]
    stats = collect({r.label: r.layer_stats for r in results})
    docs = {k: v for r in results for k, v in r.layer_stats_doc.items()}
    write_layer_stats(stats, out_dir)
    appendix = report_section(stats, docs)
    runs = {r.label: r.run_dir for r in results if r.run_dir and Path(r.run_dir).is_dir()}
    curves = train_curves_section(out_dir, runs, _train_stats_docs())
    appendix = "\n".join(x for x in (appendix, curves) if x)
    return write_report(out_dir, rows, f"Frozen probe: {name}", notes, appendix)
