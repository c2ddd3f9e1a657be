"""From an experiment file to one validated :class:`~attnlab.config.Config` per (variant, seed).

    base    = preset/file (``extends``) + [base.*] tables + CLI ``--set`` overrides
    budget  -> train.max_steps = steps, or ceil(tokens / tokens_per_step)
    variant = base + the overrides of its ``extends`` chain + its own tables + its ``set`` list
    matched = the variant with ``match_by`` (default model.ffn.hidden) chosen by
              :func:`~attnlab.experiments.matching.closest_integer`
    run     = variant with train.seed = k and experiment.{name, variant, seed_index = k, tags}
    sweep   = one resolution per grid point, the point's keys applied after each variant's own
              overrides (:mod:`~attnlab.experiments.sweeps.grid`): "arms" named ``variant@point``

Fairness is enforced here: a variant may change the model, the optimizer recipe and evaluation,
but nothing that decides which tokens are read (``data.*``, ``train.seed``, ``max_steps``,
``batch_size``, ``tokens_per_step``, ``eval_every``, ``eval_batches``), so every variant of a seed
reads the same batch schedule and is scored on the same validation sequences at the same steps.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnlab.config import (
    Config,
    ConfigError,
    apply_overrides,
    check_distinct,
    deep_merge,
    source_dict,
    validate,
)
from attnlab.experiments.matching import MatchResult, closest_integer, default_knob, knob_value
from attnlab.experiments.spec import (
    EvaluateSpec,
    ExperimentSpec,
    VariantSpec,
)
from attnlab.experiments.sweep_spec import SCHEDULE_TRAIN_KEYS, SweepSpec
from attnlab.model.params import ParamReport
from attnlab.runs.preflight import param_count as count  # any depth, absurd widths refused

#: train.* keys that decide the batch schedule or the validation points; only the base sets them
#: (a sweep may not grid them either: one list, kept in sweep_spec, which spec.py imports)
SCHEDULE_KEYS = SCHEDULE_TRAIN_KEYS


@dataclass
class Variant:
    """One resolved arm: its config (seed left at the base's), parameters and matching.

    In a sweep, ``name`` is ``variant@point``, ``base`` the variant's name in the experiment file
    and ``point`` the grid point's ``{key: value}``; otherwise ``base = name``, ``point = {}``.
    """

    name: str
    description: str
    overrides: list[str]
    config: Config
    params: ParamReport
    match: MatchResult | None = None
    base: str = ""
    point: dict[str, Any] = field(default_factory=dict)
    #: options of the base this variant's kind changes dropped (the new kind lacks them)
    dropped: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.base = self.base or self.name

    def for_seed(self, experiment: str, seed: int) -> Config:
        cfg = self.config.model_copy(deep=True)
        cfg.train.seed = seed
        cfg.experiment.name = experiment
        cfg.experiment.variant = self.name
        cfg.experiment.seed_index = seed
        return cfg


@dataclass
class RunPlan:
    """One training run of the experiment."""

    variant: str
    seed: int
    config: Config
    run_dir: Path
    stop_at: int | None = None  # pause at this step (a pruning checkpoint), resumable exactly


@dataclass
class Experiment:
    """A resolved experiment: validated variant configs, in file order."""

    name: str
    description: str
    source: str
    base: Config
    variants: dict[str, Variant]
    baseline: str
    seeds: list[int]
    steps: int
    tokens_per_step: int
    evaluate: EvaluateSpec | None = None
    notes: list[str] = field(default_factory=list)
    sweep: SweepSpec | None = None

    def runs(self, out_dir: str | Path, only: list[str] | None = None) -> list[RunPlan]:
        """Every (variant, seed), seed-major: each seed's full comparison completes in turn.
        ``only`` names variants (in a sweep: a variant selects all its grid points) or arms."""
        names = list(self.variants)
        if only:
            bases = {v.base for v in self.variants.values()}
            for n in only:
                if n not in self.variants and n not in bases:
                    from attnlab.experiments.spec import unknown_name

                    raise ConfigError(f"--only {n!r}: {unknown_name(n, sorted(bases))}")
            names = [n for n in names if n in only or self.variants[n].base in only]
        out = Path(out_dir)
        return [
            RunPlan(v, s, self.variants[v].for_seed(self.name, s), run_dir(out, v, s))
            for s in self.seeds
            for v in names
        ]

    def to_record(self) -> dict[str, Any]:
        """What ``experiment.json`` stores, so ``attnlab report`` needs no experiment file."""
        return {
            "name": self.name,
            "description": self.description,
            "source": self.source,
            "baseline": self.baseline,
            "seeds": self.seeds,
            "steps": self.steps,
            "tokens_per_step": self.tokens_per_step,
            "evaluate": self.evaluate.model_dump() if self.evaluate else None,
            "notes": self.notes,
            **({"sweep": self.sweep_record()} if self.sweep is not None else {}),
            "variants": [
                {
                    "name": v.name,
                    "description": v.description,
                    "overrides": v.overrides,
                    "params_total": v.params.total,
                    "params_non_embedding": v.params.non_embedding,
                    "params_active_non_embedding": v.params.active_non_embedding,
                    "flops_per_token": v.params.flops_per_token,
                    "match": v.match.to_dict() if v.match else None,
                    "config": v.config.to_dict(),
                    "dropped_options": v.dropped,
                    **({"sweep_variant": v.base, "sweep_point": v.point} if self.sweep else {}),
                }
                for v in self.variants.values()
            ],
        }

    def sweep_record(self) -> dict[str, Any]:
        """The grid and its options, for the sweep report."""
        assert self.sweep is not None
        bases = list(dict.fromkeys(v.base for v in self.variants.values()))
        return {
            "grid": self.sweep.grid,
            "variants": bases,
            "min_lr_ratio": self.sweep.min_lr_ratio,
            "stable_within": self.sweep.stable_within,
            "max_runs": self.sweep.max_runs,
            "prune": self.sweep.prune.model_dump(),
        }


def run_dir(out_dir: Path, variant: str, seed: int) -> Path:
    return Path(out_dir) / "runs" / variant / f"seed{seed}"


# ---------------------------------------------------------------------------------- resolving


def _base_dict(spec: ExperimentSpec, folder: Path) -> dict[str, Any]:
    base = spec.base
    if isinstance(base, str):
        base = {"extends": base}
    base = dict(base)
    if spec.plugins:  # every run's config records the experiment's plugins
        base["plugins"] = [*base.get("plugins", []), *spec.plugins]
    parent = base.pop("extends", None)
    if parent is None:
        return base
    if not isinstance(parent, str):
        raise ConfigError(f"base.extends must be a preset name or a file path, got {parent!r}")
    local = folder / parent
    src = local if parent.endswith(".toml") and local.is_file() else parent
    return deep_merge(source_dict(src), base)


def _validate(raw: dict[str, Any], what: str, notes: list[str] | None = None) -> Config:
    """``raw`` validated; its notes (options a slot's new kind lacks, dropped) go into ``notes``
    (a throwaway list when None: the same raw is validated again, e.g. while matching)."""
    try:
        return validate(raw, [] if notes is None else notes)
    except ConfigError as e:
        raise ConfigError(f"{what}: {e}") from None


def _variant_overrides(v: VariantSpec, by_name: dict[str, VariantSpec]) -> list[VariantSpec]:
    chain = [v]
    while chain[-1].extends is not None:
        chain.append(by_name[chain[-1].extends])
    return chain[::-1]


def overridden(raw: dict[str, Any], items: list[str]) -> dict[str, Any]:
    """``apply_overrides`` on a deep copy (it writes into nested tables it shares with its input)."""
    return apply_overrides(copy.deepcopy(raw), items)


def _variant_dict(base: dict[str, Any], chain: list[VariantSpec]) -> dict[str, Any]:
    raw = copy.deepcopy(base)
    for link in chain:
        try:  # its tables and its set list may not set one option twice
            check_distinct([*_flatten_tables(link.tables()), *link.set])
        except ConfigError as e:
            raise ConfigError(f"variant {link.name!r}: {e}") from None
        raw = deep_merge(raw, copy.deepcopy(link.tables()))
        raw = overridden(raw, link.set)
    return raw


def _describe(chain: list[VariantSpec]) -> list[str]:
    """The variant's effective ``key=value`` overrides (a later one of a key replaces it)."""
    out: dict[str, str] = {}
    for link in chain:
        for item in [*_flatten_tables(link.tables()), *link.set]:
            key = item.partition("=")[0].strip()
            out.pop(key, None)
            out[key] = item
    return list(out.values())


def _flatten_tables(d: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k, v in d.items():
        if isinstance(v, dict):
            out.extend(_flatten_tables(v, f"{prefix}{k}."))
        else:
            out.append(f"{prefix}{k}={v!r}" if isinstance(v, str) else f"{prefix}{k}={v}")
    return out


def _check_fair(name: str, cfg: Config, base: Config) -> None:
    bad = []
    if cfg.data != base.data:
        diff = [
            f"data.{k}"
            for k in type(cfg.data).model_fields
            if getattr(cfg.data, k) != getattr(base.data, k)
        ]
        bad.extend(diff)
    bad.extend(
        f"train.{k}" for k in SCHEDULE_KEYS if getattr(cfg.train, k) != getattr(base.train, k)
    )
    if bad:
        raise ConfigError(
            f"variant {name!r} changes {', '.join(bad)}; these decide which batches are read and "
            "when validation runs, so they must be equal across variants. Set them in [base] (or "
            "[budget]) instead"
        )


def _match(
    name: str,
    raw: dict[str, Any],
    cfg: Config,
    knob: str | None,
    target_name: str,
    target: ParamReport,
) -> tuple[Config, MatchResult]:
    knob = knob or default_knob(cfg.model)
    if not knob.startswith("model."):
        raise ConfigError(f"variant {name!r}: match_by = {knob!r} must be a model.* width key")

    def build(value: int) -> Config:
        return _validate(overridden(raw, [f"{knob}={value}"]), f"variant {name!r}")

    probe = build(1)
    if not isinstance(knob_value(probe.to_dict(), knob), int):
        raise ConfigError(
            f"variant {name!r}: match_by = {knob!r} is not an integer config key; use e.g. "
            "model.ffn.hidden, model.mixer.hidden or model.value.expert_hidden"
        )
    cache: dict[int, int] = {}

    def n_params(value: int) -> int:
        if value not in cache:
            cache[value] = count(build(value).model).non_embedding
        return cache[value]

    if n_params(2) <= n_params(1):
        raise ConfigError(
            f"variant {name!r}: match_by = {knob!r} does not change the parameter count of this "
            "model (is that part enabled?); pick the width of a part the variant has"
        )
    slope = n_params(2) - n_params(1)  # N(h) is affine in a width: its root is the likely answer
    hint = 1 + round((target.non_embedding - n_params(1)) / slope)
    value, achieved = closest_integer(n_params, target.non_embedding, hint=hint)
    result = MatchResult(target_name, knob, value, achieved, target.non_embedding)
    return build(value), result


def _budget_steps(spec: ExperimentSpec, tokens_per_step: int, notes: list[str]) -> int:
    """The budget in whole optimizer steps (``budget.tokens`` rounded up, noted in ``notes``)."""
    if spec.budget is None:
        raise ConfigError(
            "this experiment has a [ladder] table and no [budget]; run it with `attnlab ladder`"
        )
    if spec.budget.steps is not None:
        return spec.budget.steps
    steps = math.ceil(spec.budget.tokens / tokens_per_step)
    if steps * tokens_per_step != spec.budget.tokens:
        notes.append(
            f"budget.tokens={spec.budget.tokens:,} rounded up to {steps} steps x "
            f"{tokens_per_step:,} tokens = {steps * tokens_per_step:,} tokens"
        )
    return steps


def resolve(
    spec: ExperimentSpec,
    *,
    folder: str | Path = ".",
    base_overrides: list[str] = (),  # type: ignore[assignment]
    source: str = "",
    point: list[str] = (),  # type: ignore[assignment]
    min_lr_ratio: float | None = None,
) -> Experiment:
    """Validate every variant's config (and size the matched ones); nothing is trained.

    ``point`` (a sweep's grid point, ``key=value`` items) is applied after each variant's own
    overrides, so it wins over them; ``min_lr_ratio`` then sets ``train.min_lr = ratio x lr``.
    """
    folder = Path(folder)
    base_raw = overridden(_base_dict(spec, folder), list(base_overrides))
    base_notes: list[str] = []
    base0 = _validate(base_raw, "base config", base_notes)
    t = base0.train
    tokens_per_step = t.batch_plan(base0.data.seq_len).tokens  # one process: compare's runs
    notes = [f"base config: {n}" for n in base_notes]
    steps = _budget_steps(spec, tokens_per_step, notes)
    if base0.train.warmup_steps > steps:
        raise ConfigError(
            f"the budget of {steps} steps is shorter than train.warmup_steps="
            f"{base0.train.warmup_steps}; raise the budget or set train.warmup_steps in [base.train]"
        )
    base_raw = overridden(base_raw, [f"train.max_steps={steps}"])
    base = _validate(base_raw, f"base config with the budget of {steps} steps")
    if base.train.eval_every > steps:
        notes.append(
            f"train.eval_every={base.train.eval_every} > {steps} steps: validation runs only at "
            "the end, so the curves have one point; lower train.eval_every in [base.train]"
        )
    if spec.evaluate is not None:
        from attnlab.eval.registry import task_key

        for task in spec.evaluate.tasks:
            task_key(task)  # an unknown task name fails here, with the nearest spelling
    by_name = {v.name: v for v in spec.variants}
    raws: dict[str, dict[str, Any]] = {}
    variants: dict[str, Variant] = {}
    for v in spec.variants:
        chain = _variant_overrides(v, by_name)
        raw = overridden(_variant_dict(base_raw, chain), list(point))
        if min_lr_ratio is not None:
            lr = _validate({**raw, "train": {**raw.get("train", {}), "min_lr": 0.0}}, v.name)
            raw = overridden(raw, [f"train.min_lr={min_lr_ratio * lr.train.lr!r}"])
        what = f"variant {v.name!r}" + (f" at sweep point {', '.join(point)}" if point else "")
        got: list[str] = []
        cfg = _validate(raw, what, got)
        dropped = [n for n in got if n not in base_notes]
        _check_fair(v.name, cfg, base)
        raws[v.name] = raw
        notes += [f"{what}: {n}" for n in dropped]
        variants[v.name] = Variant(
            v.name, v.description, _describe(chain), cfg, count(cfg.model), dropped=dropped
        )
        variants[v.name].config.experiment.tags = [*cfg.experiment.tags, *v.tags]
    for v in spec.variants:
        if v.match_params is None:
            continue
        target = variants[v.match_params]
        cfg, result = _match(
            v.name, raws[v.name], variants[v.name].config, v.match_by, target.name, target.params
        )
        _check_fair(v.name, cfg, base)
        cfg.experiment.tags = variants[v.name].config.experiment.tags
        variants[v.name] = Variant(
            v.name,
            v.description,
            [*variants[v.name].overrides, f"{result.knob}={result.value}"],
            cfg,
            count(cfg.model),
            result,
            dropped=variants[v.name].dropped,
        )
    return Experiment(
        name=spec.name or "experiment",
        description=spec.description,
        source=source,
        base=base,
        variants=variants,
        baseline=spec.baseline_name,
        seeds=list(spec.seeds),
        steps=steps,
        tokens_per_step=tokens_per_step,
        evaluate=spec.evaluate,
        notes=notes,
    )
