"""The experiment file: a base config, named variants, seeds and a budget (TOML).

    name = "quick"                      # optional; default: the file's stem
    description = "..."
    base = "tiny"                       # a preset name or config path, or a table:
    # [base]  extends = "tiny"           #   ... with [base.model], [base.train], ... overrides
    seeds = [0, 1]                      # train.seed of each repetition; runs go to seed<k>/
    baseline = "baseline"               # optional; default: the first variant
    plugins = ["my_ideas.py"]           # optional: modules/.py files registering parts (a
                                        #   relative path is read from this file's folder)

    [budget]
    steps = 300                         # or: tokens = 1_000_000 (rounded up to whole steps)

    [evaluate]                          # optional: `attnlab eval` tasks after each finished run
    tasks = ["perplexity"]              #   (their metrics become columns of the report)
    limit = 2

    [[variants]]
    name = "nonlinear-query"
    set = ["model.query.kind=nonlinear"]   # dotted overrides, and/or section tables:
    train = { lr = 3e-3 }                  # model = {...}, train = {...}, eval = {...}
    extends = "other-variant"              # optional: that variant's overrides come first
    match_params = "preproj-skip"          # optional: resize this variant's MLP (match_by) so its
    match_by = "model.ffn.hidden"          #   non-embedding parameter count is closest to that one

    [sweep]                                # optional: a grid over config keys, run for every
    "train.lr" = [1e-3, 3e-3, 1e-2]        #   variant and seed (see attnlab.experiments.sweep_spec)

    [ladder]                               # `attnlab ladder`: every variant at several sizes,
    rungs = 5                              #   each on D = tokens_per_param x N tokens (instead of
    tokens_per_param = 20                  #   [budget]; see attnlab.experiments.ladder_spec)

Every key is checked (unknown keys name the nearest spelling); the variants' configs are fully
validated by :mod:`attnlab.experiments.resolve` before anything trains.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator, model_validator

from attnlab.base.pathkind import not_a_file
from attnlab.base.section import Section, seed_type
from attnlab.config import (
    ConfigError,
    fields_at,
    load_config_plugins,
    read_toml_file,
    resolve_plugin_paths,
)
from attnlab.experiments.ladder_spec import LadderSpec
from attnlab.experiments.sweep_spec import SweepSpec

#: a variant name becomes a directory name
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._+-]*$"


class _Spec(Section):
    """Strict like every config table: unknown keys, booleans for numbers, inf/NaN refused."""


class Budget(_Spec):
    """How long every run trains: optimizer steps, or tokens (rounded up to whole steps)."""

    steps: int | None = Field(None, ge=1)
    tokens: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _one(self) -> Budget:
        if (self.steps is None) == (self.tokens is None):
            raise ValueError("[budget] needs exactly one of budget.steps or budget.tokens")
        return self


class EvaluateSpec(_Spec):
    """Tasks of ``attnlab eval`` run on each finished run (results become report columns)."""

    tasks: list[str] = Field(min_length=1)
    limit: int | None = Field(None, ge=1, description="items (or documents) per task")
    batch_size: int = Field(8, ge=1)
    lengths: list[int] | None = Field(
        None,
        description="perplexity tasks at each length (keys TASK@L; limit = windows per length)",
    )


class VariantSpec(_Spec):
    """One arm of the comparison: the base config plus this variant's overrides."""

    name: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    extends: str | None = None
    set: list[str] = Field(default_factory=list)
    model: dict[str, Any] = Field(default_factory=dict)
    train: dict[str, Any] = Field(default_factory=dict)
    eval: dict[str, Any] = Field(default_factory=dict)
    tags: list[str] = Field(default_factory=list)
    match_params: str | None = None
    match_by: str | None = Field(
        None, description="integer config key resized by match_params; None = the MLP width"
    )

    def tables(self) -> dict[str, Any]:
        """The section tables this variant sets, as a raw config dict."""
        return {
            k: v
            for k, v in (("model", self.model), ("train", self.train), ("eval", self.eval))
            if v
        }


class ExperimentSpec(_Spec):
    """The whole experiment file."""

    name: str | None = Field(None, pattern=NAME_PATTERN)
    description: str = ""
    plugins: list[str] = Field(default_factory=list)
    base: str | dict[str, Any] = Field(default_factory=dict)
    seeds: list[seed_type("train.seed of one repetition")] = Field(  # type: ignore[valid-type]
        default_factory=lambda: [0], min_length=1
    )
    budget: Budget | None = None
    baseline: str | None = None
    evaluate: EvaluateSpec | None = None
    sweep: SweepSpec | None = None
    ladder: LadderSpec | None = None
    variants: list[VariantSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _budget(self) -> ExperimentSpec:
        if self.ladder is None and self.budget is None:
            raise ValueError("missing key budget: add [budget] with steps = N or tokens = N")
        if self.ladder is not None and self.budget is not None:
            raise ValueError(
                "[budget] and [ladder] both set the budget; a ladder's rung trains on "
                "ladder.tokens_per_param x N tokens, so remove [budget]"
            )
        if self.ladder is not None and self.sweep is not None:
            raise ValueError(
                "[sweep] and [ladder] both set; a ladder tunes the learning rate itself "
                "(ladder.lr), so remove [sweep]"
            )
        return self

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: list[int]) -> list[int]:
        if any(s < 0 for s in v):
            raise ValueError("seeds must be >= 0")
        if len(set(v)) != len(v):
            raise ValueError(f"seeds {v} repeat a value; every seed runs once")
        return v

    @model_validator(mode="after")
    def _references(self) -> ExperimentSpec:
        names = [v.name for v in self.variants]
        problems = []
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            problems.append(f"variant names must be unique; repeated: {', '.join(dup)}")
        if self.baseline is not None and self.baseline not in names:
            problems.append(f"baseline = {self.baseline!r}: {unknown_name(self.baseline, names)}")
        by_name = {v.name: v for v in self.variants}
        for v in self.variants:
            if v.extends is not None:
                if v.extends not in names:
                    problems.append(
                        f"variant {v.name!r}: extends = {v.extends!r}: {unknown_name(v.extends, names)}"
                    )
                else:
                    chain, cur = [v.name], v
                    while cur.extends is not None and cur.extends in by_name:
                        if cur.extends in chain:
                            problems.append(
                                f"variant {v.name!r} extends itself through "
                                f"{' -> '.join([*chain, cur.extends])}"
                            )
                            break
                        chain.append(cur.extends)
                        cur = by_name[cur.extends]
            if v.match_params is None:
                if v.match_by is not None:
                    problems.append(f"variant {v.name!r}: match_by needs match_params")
                continue
            target = v.match_params
            if target == v.name:
                problems.append(f"variant {v.name!r}: match_params names itself")
            elif target not in names:
                problems.append(
                    f"variant {v.name!r}: match_params = {target!r}: {unknown_name(target, names)}"
                )
            elif by_name[target].match_params is not None:
                problems.append(
                    f"variant {v.name!r}: match_params = {target!r}, but {target!r} is itself "
                    "matched to another variant; match to a variant with a fixed size"
                )
        if problems:
            raise ValueError("\n".join(problems))
        return self

    @property
    def baseline_name(self) -> str:
        return self.baseline or self.variants[0].name


def unknown_name(name: str, names: list[str]) -> str:
    near = difflib.get_close_matches(name, names, n=1, cutoff=0.4)
    hint = f"did you mean {near[0]!r}? " if near else ""
    return f"no such variant; {hint}variants: {', '.join(names)}"


# ------------------------------------------------------------------------------------- errors


def _where(loc: tuple[Any, ...], raw: dict[str, Any]) -> str:
    """``variants[2].sett`` plus the variant's name when it has one."""
    out, node = "", raw
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            node = None
    if len(loc) >= 2 and loc[0] == "variants" and isinstance(loc[1], int):
        try:
            name = raw["variants"][loc[1]].get("name")
        except (KeyError, IndexError, AttributeError):
            name = None
        if name:
            out += f" (variant {name!r})"
    return out


def _explain(err: ValidationError, raw: dict[str, Any], where: str) -> str:
    lines = []
    for e in err.errors():
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and "[" in p))
        dotted = _where(loc, raw) or "(top level)"
        kind = e["type"]
        if kind == "extra_forbidden":
            valid = fields_at(ExperimentSpec, loc[:-1])
            near = difflib.get_close_matches(str(loc[-1]), valid, n=1, cutoff=0.4)
            hint = f" did you mean {near[0]!r}?" if near else ""
            lines.append(f"unknown key {dotted}.{hint} Valid keys here: {', '.join(valid)}")
        elif kind == "missing":
            lines.append(f"missing key {dotted}")
        elif kind == "value_error":
            msg = str(e.get("ctx", {}).get("error", e["msg"]))
            lines.extend(msg.split("\n"))
        elif kind == "string_pattern_mismatch":
            lines.append(
                f"{dotted} = {e['input']!r} cannot name a directory; use letters, digits, "
                "'.', '_', '+' and '-'"
            )
        else:
            lines.append(f"{dotted} = {e['input']!r}: {e['msg']}")
    return f"{where}: invalid experiment:\n  - " + "\n  - ".join(lines)


def parse_experiment(raw: dict[str, Any], where: str = "experiment") -> ExperimentSpec:
    """Validate a raw experiment dict; every problem is one line of the :class:`ConfigError`."""
    for i, v in enumerate(raw.get("variants") or []):
        if isinstance(v, dict) and "data" in v:
            name = v.get("name", f"#{i}")
            raise ConfigError(
                f"{where}: variant {name!r} sets [data]; every variant must read the same "
                "tokens. Put data settings in [base.data]"
            )
    try:
        return ExperimentSpec.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_explain(e, raw, where)) from None


def read_experiment(path: str | Path) -> tuple[ExperimentSpec, dict[str, Any]]:
    """Read and validate an experiment file; returns the spec and its raw dict."""
    p = Path(path)
    if not p.is_file():
        hint = ""
        shipped = Path("configs/experiments")
        if shipped.is_dir():
            names = sorted(f.name for f in shipped.glob("*.toml"))
            near = difflib.get_close_matches(p.name, names, n=1, cutoff=0.5)
            hint = f"; did you mean configs/experiments/{near[0]}?" if near else ""
        raise ConfigError(f"experiment file {str(path)!r} {not_a_file(p)}{hint}")
    raw = resolve_plugin_paths(read_toml_file(p, "experiment file"), p.parent)
    load_config_plugins(raw)  # before any variant's config names one of their parts
    spec = parse_experiment(raw, str(path))
    if spec.name is None:
        spec.name = p.stem
    return spec, raw
