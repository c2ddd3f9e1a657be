"""The ``[sweep]`` table of an experiment file: a grid over config keys, and its options.

    [sweep]
    "train.lr" = [1e-3, 3e-3, 1e-2]        # grid keys: any model.* / train.* / eval.* key
    "train.weight_decay" = [0.0, 0.1]      #   (quoted, or as nested tables: train.lr = [...])
    min_lr_ratio = 0.1                     # optional: train.min_lr = ratio x train.lr per point
    stable_within = 5.0                    # percent, for the stable learning-rate range (default 5)
    max_runs = 200                         # optional: refuse a grid with more runs than this

    [sweep.prune]                          # optional early stopping, off by default
    enabled = true
    at = [100]                             # steps (multiples of eval_every and checkpoint_every)
    factor = 1.25                          # pruned if val loss > factor x median of its group

The grid expands into ``variants x points x seeds`` runs (:mod:`attnlab.experiments.sweeps.grid`).
Keys that decide which batches are read or when validation runs (``data.*``, ``train.seed``,
``train.max_steps``, ``train.batch_size``, ``train.tokens_per_step``, ``train.eval_every``,
``train.eval_batches``) are refused: every run of a seed must read the same batch schedule, or
"best vs best" would compare runs that saw different data. Sweep them with one experiment per
value (separate ``--out`` directories) instead.
"""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, Field, model_validator

from attnlab.base.section import Section
from attnlab.config import Config, flatten

#: grid keys live in these config sections
GRID_SECTIONS = ("model", "train", "eval")
#: train.* keys that decide the batch schedule or the validation points (resolve.SCHEDULE_KEYS:
#: no variant and no grid point may change them)
SCHEDULE_TRAIN_KEYS = (
    "seed",
    "max_steps",
    "batch_size",
    "tokens_per_step",
    "eval_every",
    "eval_batches",
)
OPTIONS = ("min_lr_ratio", "stable_within", "max_runs", "prune")
DEFAULT_STABLE_WITHIN = 5.0


class PruneSpec(Section):
    """Early stopping of hopeless grid points (off by default).

    At each step ``s`` of ``at``, every run of a (variant, seed) group that reached ``s`` is
    compared with the median validation loss of its group at ``s``; a run above
    ``factor x median`` is stopped and recorded as ``pruned``. Each step is run to completion for
    the whole grid before deciding, so the decisions do not depend on ``--jobs`` or timing.
    """

    enabled: bool = False
    at: list[int] = Field(
        default_factory=list,
        description="steps at which to prune; empty = the first eval+checkpoint step >= 1/4 budget",
    )
    factor: float = Field(1.25, gt=1.0)


class SweepSpec(Section):
    """A grid over config keys plus the sweep's options (module docstring)."""

    grid: dict[str, Any] = Field(min_length=1)
    min_lr_ratio: float | None = Field(None, gt=0, le=1)
    stable_within: float = Field(DEFAULT_STABLE_WITHIN, gt=0)
    max_runs: int | None = Field(None, ge=1)
    prune: PruneSpec = PruneSpec()

    @model_validator(mode="before")
    @classmethod
    def _split(cls, raw: Any) -> Any:
        """Everything that is not an option is a grid key (nested tables become dotted keys)."""
        if not isinstance(raw, dict) or "grid" in raw:
            return raw
        options = {k: v for k, v in raw.items() if k in OPTIONS}
        grid = flatten({k: v for k, v in raw.items() if k not in OPTIONS})
        return {**options, "grid": grid}

    @model_validator(mode="after")
    def _check(self) -> SweepSpec:
        problems = []
        for key, values in self.grid.items():
            problem = grid_key_problem(key)
            if problem:
                problems.append(problem)
                continue
            if not isinstance(values, list) or not values:
                problems.append(f"sweep key {key!r} needs a non-empty list of values, e.g. [1, 2]")
                continue
            if any(isinstance(v, dict | list) for v in values):
                problems.append(f"sweep key {key!r}: values must be numbers, strings or booleans")
                continue
            if len({repr(v) for v in values}) != len(values):
                problems.append(f"sweep key {key!r} repeats a value: {values}")
        if self.min_lr_ratio is not None and "train.min_lr" in self.grid:
            problems.append("sweep.min_lr_ratio sets train.min_lr; do not also sweep train.min_lr")
        if any(s < 1 for s in self.prune.at):
            problems.append(f"sweep.prune.at = {self.prune.at}: steps must be >= 1")
        if problems:
            raise ValueError("\n".join(problems))
        return self

    @property
    def n_points(self) -> int:
        n = 1
        for values in self.grid.values():
            n *= len(values)
        return n


def _config_keys(cls: type[BaseModel] = Config, prefix: str = "") -> list[str]:
    """Every dotted leaf key of the config schema; a slot table's keys are those of every
    registered part of the slot (the grid point's config, validated later, checks the kind)."""
    from attnlab.base.schema import slot_of
    from attnlab.parts import registry

    out = []
    for name, field in cls.model_fields.items():
        slot = slot_of(field)
        if slot is not None:
            keys = {k for spec in registry.specs(slot) for k in spec.options.model_fields}
            out.extend(f"{prefix}{name}.{k}" for k in sorted(keys | {"kind"}))
            continue
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out.extend(_config_keys(ann, f"{prefix}{name}."))
        else:
            out.append(f"{prefix}{name}")
    return out


def grid_key_problem(key: str) -> str | None:
    """Why ``key`` cannot be a grid key (unknown, or it would change the batch schedule)."""
    section = key.split(".", 1)[0]
    if section == "data" or key in {f"train.{k}" for k in SCHEDULE_TRAIN_KEYS}:
        what = "the seeds list" if key == "train.seed" else "[budget]" if "max_steps" in key else ""
        alt = f" (use {what})" if what else ""
        return (
            f"sweep key {key!r} decides which batches are read or when validation runs; every run "
            "of a seed must read the same batch schedule, so it cannot be swept. Set it in "
            f"[base]{alt}, or run one experiment per value with separate --out directories"
        )
    known = _config_keys()
    if key in known and section in GRID_SECTIONS:
        return None
    if section not in (*GRID_SECTIONS, "experiment"):
        near = difflib.get_close_matches(key, [*OPTIONS, *known], n=1, cutoff=0.6)
        hint = f" did you mean {near[0]!r}?" if near else ""
        return (
            f"unknown key {key!r} in [sweep].{hint} [sweep] holds grid keys (model.*, train.*, "
            f"eval.*) and the options {', '.join(OPTIONS)}"
        )
    if section == "experiment":
        return f"sweep key {key!r}: experiment.* labels are set by attnlab compare"
    near = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    return f"sweep key {key!r} is not a config key{hint}"
