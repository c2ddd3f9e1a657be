"""Expanding a ``[sweep]`` grid: one resolution of the experiment per grid point.

    points = product of the grid's value lists, in file order (the first key varies slowest)
    arm    = (variant, point), named ``variant@key=value,...`` (short key names: the last part of
             the dotted key, or the whole key where two would collide)
    runs   = arms x seeds, seed-major (each seed's whole grid completes in turn)

A point's keys are applied after the variant's own overrides (the grid wins over them), then
``min_lr_ratio`` (when set) and parameter matching; every arm is validated here, before anything
trains. The batch schedule of a run depends only on the data, ``seq_len``, the batch, the budget
and ``train.seed``, none of which a grid key may change (:mod:`~attnlab.experiments.sweep_spec`), so every arm of a
seed reads the same batches: the report checks the stored schedule hashes.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

from attnlab.config import ConfigError
from attnlab.experiments.resolve import Experiment, Variant, resolve
from attnlab.experiments.spec import ExperimentSpec

#: characters an arm name (a directory name) may hold
_SAFE = re.compile(r"^[A-Za-z0-9._+=,-]+$")


def grid_points(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the grid's values, the first key varying slowest."""
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*grid.values())]


def short_names(keys: list[str]) -> dict[str, str]:
    """``train.lr -> lr``; a last part shared by two keys keeps the whole dotted key."""
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: (s if last.count(s) == 1 else k) for k, s in zip(keys, last)}


def format_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def point_labels(points: list[dict[str, Any]]) -> list[str]:
    """``lr=0.001,weight_decay=0.1`` per point; ``p<i>`` when values cannot name a directory."""
    if not points or not points[0]:
        return ["" for _ in points]
    names = short_names(list(points[0]))
    labels = [",".join(f"{names[k]}={format_value(v)}" for k, v in p.items()) for p in points]
    if len(set(labels)) != len(labels) or not all(_SAFE.match(label) for label in labels):
        width = len(str(len(points) - 1))
        labels = [f"p{i:0{width}d}" for i in range(len(points))]
    return labels


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    return repr(v)


def override_items(point: dict[str, Any]) -> list[str]:
    """The point as ``--set``-style ``key=value`` items (values as TOML)."""
    return [f"{k}={_toml(v)}" for k, v in point.items()]


def expand(
    spec: ExperimentSpec,
    *,
    folder: str | Path = ".",
    base_overrides: list[str] = (),  # type: ignore[assignment]
    source: str = "",
) -> Experiment:
    """Resolve ``spec`` once per grid point; the arms of every variant, variant-major."""
    sweep = spec.sweep
    assert sweep is not None
    points = grid_points(sweep.grid)
    labels = point_labels(points)
    per_point: list[Experiment] = []
    for point in points:
        per_point.append(
            resolve(
                spec,
                folder=folder,
                base_overrides=base_overrides,
                source=source,
                point=override_items(point),
                min_lr_ratio=sweep.min_lr_ratio,
            )
        )
    first = per_point[0]
    _check_match_knobs(first, sweep.grid)
    arms: dict[str, Variant] = {}
    for name in first.variants:
        for point, label, exp in zip(points, labels, per_point):
            v = exp.variants[name]
            arm = f"{name}@{label}"
            v.config.experiment.tags = [*v.config.experiment.tags, *override_items(point)]
            items = override_items(point)
            keys = {i.partition("=")[0] for i in items}
            kept = [o for o in v.overrides if o.partition("=")[0].strip() not in keys]
            arms[arm] = Variant(
                arm,
                v.description,
                [*kept, *items],
                v.config,
                v.params,
                v.match,
                name,
                point,
                v.dropped,
            )
    notes = list(dict.fromkeys(n for exp in per_point for n in exp.notes))
    for v in spec.variants:
        own = {o.partition("=")[0].strip() for o in first.variants[v.name].overrides}
        clash = sorted(own & set(sweep.grid))
        if clash:
            notes.append(
                f"variant {v.name!r} sets {', '.join(clash)}; the sweep's values replace it"
            )
    exp = Experiment(
        name=first.name,
        description=first.description,
        source=source,
        base=first.base,
        variants=arms,
        baseline=first.baseline,
        seeds=first.seeds,
        steps=first.steps,
        tokens_per_step=first.tokens_per_step,
        evaluate=first.evaluate,
        notes=notes,
        sweep=sweep.model_copy(deep=True),
    )
    _resolve_prune_steps(exp)
    return exp


def _check_match_knobs(exp: Experiment, grid: dict[str, Any]) -> None:
    """A matched variant's width is chosen by matching; a grid over that width would be undone."""
    for v in exp.variants.values():
        if v.match is None:
            continue
        knobs = {v.match.knob}
        if v.match.knob == "model.ffn.hidden":
            knobs.add("model.ffn.ratio")  # an explicit hidden width overrides the ratio
        clash = sorted(knobs & set(grid))
        if clash:
            raise ConfigError(
                f"sweep key {clash[0]!r} sets the width that match_params sizes for variant "
                f"{v.name!r} ({v.match.knob}); it cannot also be swept. Remove it from [sweep] "
                "or drop the matching"
            )


def _resolve_prune_steps(exp: Experiment) -> None:
    """Fill in the default pruning step and check every step is a validation + checkpoint step."""
    assert exp.sweep is not None
    prune = exp.sweep.prune
    if not prune.enabled:
        return
    cfgs = [v.config for v in exp.variants.values()]
    evals = {c.train.eval_every for c in cfgs}
    ckpts = {c.train.checkpoint_every for c in cfgs}
    steps = exp.steps

    def fits(s: int) -> bool:
        return all(s % e == 0 for e in evals) and all(s % c == 0 for c in ckpts)

    if not prune.at:
        candidates = [s for s in range(max(1, steps // 4), steps) if fits(s)]
        if not candidates:
            raise ConfigError(
                f"sweep.prune: no step below the budget of {steps} is both a validation step "
                f"(train.eval_every={sorted(evals)}) and a checkpoint step (train.checkpoint_every="
                f"{sorted(ckpts)}); set sweep.prune.at, or make checkpoint_every a multiple of "
                "eval_every"
            )
        prune.at = [candidates[0]]
    bad = [s for s in prune.at if s >= steps or not fits(s)]
    if bad:
        raise ConfigError(
            f"sweep.prune.at = {prune.at}: steps {bad} must be below the budget ({steps}) and "
            f"multiples of train.eval_every ({sorted(evals)}) and train.checkpoint_every "
            f"({sorted(ckpts)}), so that every run has a validation loss there and resumes from "
            "a checkpoint exactly"
        )
    prune.at = sorted(set(prune.at))
