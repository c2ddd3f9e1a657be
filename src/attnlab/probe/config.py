"""The probe's typed config: base model, method, part options, recipe, data and evaluation.

The part options are ``[probe.<slot>]`` tables in the words of a training config's
``[model.<slot>]`` (:mod:`~attnlab.probe.part_tables`): ``[probe.feature_map] kind =
"pre_projection"; expansion = 2.0``.

A probe config is a TOML file (or the defaults) plus ``--set dotted.key=value`` overrides, validated
the way :mod:`attnlab.config` validates a training config: an unknown key names the nearest valid
spelling and the valid keys, a wrong value names the allowed ones. An *experiment* file is a probe
config with a ``methods`` list (strings, or ``[[methods]]`` tables with ``method``, an optional
``name`` and any per-method config keys); every method then runs on the shared settings.

The ``[train]`` table is the shared training recipe (:mod:`attnlab.recipe`: the same keys, with the
same meanings, as ``attnlab train``'s) plus ``seq_len`` and ``gradient_checkpointing``; keys of
earlier versions are handled by :mod:`~attnlab.probe.moved_keys`. Defaults follow seed 000's recipe:
AdamW, cosine schedule, lr 1e-5, batch 16 sequences of 512 tokens, 500 steps, bf16 autocast on a
GPU. Unstated details follow the Hugging Face ``Trainer`` defaults the paper's code is built on: no
warmup, no weight decay, betas (0.9, 0.999), clip 1.0.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from attnlab.base.errors import UserError
from attnlab.base.pathkind import not_a_file
from attnlab.base.section import Section
from attnlab.config import (
    OLD_PROBE_PARTS,
    PROBE_RENAMED,
    ConfigError,
    apply_overrides,
    deep_merge,
    load_config_plugins,
    read_toml_file,
    resolve_plugin_paths,
    to_toml,
    with_plugins,
)
from attnlab.config import explain as explain_validation
from attnlab.parts import PartOptions
from attnlab.probe.methods import (
    DEFAULT_METHOD,
    Component,
    Method,
    MethodError,
    method_slug,
    parse_method,
)
from attnlab.probe.moved_keys import refuse_moved
from attnlab.probe.part_tables import (
    ProbeParts,
    in_todays_tables,
    method_tables,
    table_problems,
)
from attnlab.recipe import (
    BatchPlan,
    Beta,
    LearningRate,
    MicroBatch,
    MinLearningRate,
    TrainRecipe,
    WarmupSteps,
    WeightDecay,
)


class BaseModelConfig(Section):
    """Which pretrained causal LM to probe."""

    model: str = Field(
        "smollm2-135m",
        description="a hub id (online), a local HF directory, a .gguf file, or 'smollm2-135m'",
    )
    gguf_file: str | None = Field(None, description="a GGUF file inside the directory `model`")
    revision: str | None = Field(None, description="hub revision (branch, tag or commit)")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="weights dtype; auto = bfloat16 on CUDA, float32 elsewhere"
    )
    attn_implementation: Literal["auto", "eager", "sdpa"] = "auto"


class LoraOptions(Section):
    """PEFT LoRA on the attention projections."""

    rank: int = Field(64, ge=1, description="used unless the method says '@TARGET'")
    alpha: float | None = Field(None, gt=0, description="None = rank (scaling alpha/r = 1)")
    dropout: float = Field(0.0, ge=0, lt=1)
    targets: list[str] = Field(
        default_factory=list,
        description="module names inside each attention block; [] = the architecture's q/k/v/o",
    )


class ProbeTrainConfig(TrainRecipe):
    """The probe's ``[train]``: the shared recipe (:mod:`attnlab.recipe`, the same keys with the
    same meanings as ``attnlab train``'s) with seed 000's defaults, plus the sequence length and
    gradient checkpointing. The effective batch is ``tokens_per_step`` (None: one micro-batch
    of ``batch_size`` sequences per step)."""

    max_steps: Annotated[int, Field(ge=0, description="optimizer steps; 0 = train nothing")] = 500
    batch_size: MicroBatch = 16
    lr: LearningRate = 1e-5
    min_lr: MinLearningRate = 0.0
    warmup_steps: WarmupSteps = 0
    weight_decay: WeightDecay = 0.0
    beta2: Beta = 0.999
    eval_every: Annotated[
        int,
        Field(
            ge=0,
            description="validation loss every n steps; 0 = none (the end's evaluation "
            "is the probe's perplexity)",
        ),
    ] = 0
    seq_len: int = Field(512, ge=2, description="tokens per training sequence")
    gradient_checkpointing: bool = False

    @property
    def plan(self) -> BatchPlan:
        """The micro-batches of one step (the probe runs in one process)."""
        return self.batch_plan(self.seq_len)

    @model_validator(mode="after")
    def _check_batch(self) -> ProbeTrainConfig:
        try:
            self.batch_plan(self.seq_len)
        except UserError as e:
            raise ValueError(str(e)) from None
        return self


class ProbeDataConfig(Section):
    """The training corpus, tokenized with the base model's own tokenizer."""

    corpus: str = Field("wiki-sample", description="a source name, a local path or glob, hf:NAME")
    dir: str | None = Field(None, description="prepared tokens; None = data/<corpus>-<base>")
    val_fraction: float = Field(0.05, gt=0, lt=1)
    max_documents: int | None = Field(None, ge=1)
    replace_invalid_utf8: bool = False


class ProbeEvalConfig(Section):
    """Evaluation after training: validation perplexity, plus cloze / multiple-choice tasks."""

    tasks: list[str] = Field(default_factory=lambda: ["perplexity"])
    limit: int | None = Field(500, ge=1, description="examples per task (seed 000 used 500)")
    batch_size: int = Field(8, ge=1)
    max_length: int | None = Field(None, ge=2, description="context; None = train.seq_len")
    stride: int | None = Field(None, ge=1, description="perplexity window stride")
    val_sequences: int = Field(16, ge=1, description="windows of the in-training val loss")
    val_tokens: int | None = Field(
        None,
        ge=1,
        description="perplexity on the first n validation tokens (documents in order, the last "
        "one cut); None = eval.limit whole documents",
    )


class ProbeConfig(Section):
    """One probe run: a frozen base, a method, and how to train and evaluate it."""

    plugins: list[str] = Field(default_factory=list)
    name: str = ""
    base: BaseModelConfig = BaseModelConfig()
    method: str = DEFAULT_METHOD
    probe: ProbeParts = Field(
        default_factory=ProbeParts,
        description="options of the injected parts, one table per slot as in [model.<slot>]: "
        "[probe.feature_map] kind = 'pre_projection'",
    )
    lora: LoraOptions = LoraOptions()
    train: ProbeTrainConfig = ProbeTrainConfig()
    data: ProbeDataConfig = ProbeDataConfig()
    eval: ProbeEvalConfig = ProbeEvalConfig()

    @model_validator(mode="before")
    @classmethod
    def _todays_tables(cls, data: Any) -> Any:
        """Old ``[parts]`` tables as ``[probe.<slot>]`` ones, kinds from the method (what
        :func:`validate_probe` did already, for a config built in code)."""
        if not isinstance(data, Mapping):
            return data
        try:
            return in_todays_tables(data, [])
        except ConfigError as e:
            raise PydanticCustomError("same_option", "{message}", {"message": str(e)}) from None

    @model_validator(mode="after")
    def _tables_match_the_method(self) -> ProbeConfig:
        problems = table_problems(self.probe, self.method)
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def part_options(self, comp: Component) -> PartOptions:
        """The options of an injected part (its slot's table, else its defaults)."""
        return self.probe.options(comp)

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        """The name becomes a directory under ``OUT/runs``: a plain file name, nothing else."""
        bad = [c for c in v if c in "\\:" or not c.isprintable()]
        if v and (v.startswith((".", "-")) or bad or len(v) > 100):
            raise ValueError(
                f"name {v!r} cannot be a directory name; use letters, digits and - _ . + @ "
                "(not starting with '.' or '-', at most 100 characters)"
            )
        return v

    @field_validator("method")
    @classmethod
    def _parse(cls, v: str) -> str:
        try:
            return parse_method(v).name
        except MethodError as e:
            raise ValueError(str(e)) from None

    @property
    def parsed_method(self) -> Method:
        return parse_method(self.method)

    @property
    def label(self) -> str:
        return self.name or self.method

    @property
    def dir_name(self) -> str:
        """The run's directory name under ``OUT/runs``: the name, or the method's slug."""
        name = self.name or method_slug(parse_method(self.method))
        return name.replace("/", "-").replace(" ", "-")

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class MethodEntry(BaseModel):
    """One row of an experiment: a method, a display name, and per-method config keys."""

    method: str
    name: str = ""
    overrides: dict[str, Any] = Field(default_factory=dict)


# ----------------------------------------------------------------------------------- errors


def explain(
    err: ValidationError, root: type[BaseModel] = ProbeConfig, raw: Mapping[str, Any] | None = None
) -> str:
    """The shared config error messages, with valid keys looked up in the probe schema and the
    probe's old keys named (:data:`attnlab.config.legacy.PROBE_RENAMED`)."""
    return explain_validation(
        err, root, title="invalid probe config", raw=raw, renamed=PROBE_RENAMED
    )


# ---------------------------------------------------------------------------------- loading


def validate_probe(raw: Mapping[str, Any], notes: list[str] | None = None) -> ProbeConfig:
    """A raw dict as a :class:`ProbeConfig`, or :class:`ConfigError` naming every problem (a
    ``[train]`` key that moved to the shared recipe: one line naming its new name). An old
    ``[parts.NAME]`` table is read as today's ``[probe.<slot>]`` with a note: into ``notes``
    when given, else a :class:`OldKeyWarning` (one ``attnlab probe: warning:`` line)."""
    refuse_moved(raw)
    raw = load_config_plugins(dict(raw))
    said: list[str] = []
    raw = in_todays_tables(raw, said)
    _deliver(said, notes)
    try:
        return ProbeConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(explain(e, raw=raw)) from None


class OldKeyWarning(UserWarning):
    """A probe config's key of an earlier version was read under its new spelling."""


def _deliver(said: list[str], notes: list[str] | None) -> None:
    if notes is not None:
        notes.extend(n for n in said if n not in notes)
        return
    for note in said:
        warnings.warn(note, OldKeyWarning, stacklevel=3)


def read_probe_file(path: str | Path | None) -> dict[str, Any]:
    """The raw dict of a probe/experiment TOML file ({} for None)."""
    if path is None:
        return {}
    if not Path(path).is_file():
        raise ConfigError(f"probe config {str(path)!r} {not_a_file(path)}; give a .toml file")
    return resolve_plugin_paths(read_toml_file(path, "probe config"), Path(path).parent)


def load_probe_config(
    path: str | Path | None = None, overrides: Iterable[str] = (), plugins: Iterable[str] = ()
) -> ProbeConfig:
    """One run's config from a TOML file (or the defaults) plus ``--plugin`` and ``--set``."""
    raw = with_plugins(read_probe_file(path), plugins)
    if "methods" in raw:
        raise ConfigError(
            f"{path} is an experiment file (it has a 'methods' list); load it with "
            "load_experiment, or run `attnlab probe` on it to train every method"
        )
    return validate_probe(apply_overrides(raw, overrides))


def is_experiment_file(path: str | Path) -> bool:
    return "methods" in read_probe_file(path)


def _entries(raw_methods: Any, where: str) -> list[MethodEntry]:
    if not isinstance(raw_methods, list) or not raw_methods:
        raise ConfigError(f"{where}: 'methods' must be a non-empty list of method strings/tables")
    out = []
    for i, item in enumerate(raw_methods):
        if isinstance(item, str):
            out.append(MethodEntry(method=item))
        elif isinstance(item, Mapping):
            item = dict(item)
            if "method" not in item:
                raise ConfigError(f"{where}: methods[{i}] has no 'method' key")
            method, name = item.pop("method"), item.pop("name", "")
            out.append(MethodEntry(method=str(method), name=str(name), overrides=item))
        else:
            raise ConfigError(f"{where}: methods[{i}] = {item!r} is neither a string nor a table")
    return out


# Per-method keys that would change which tokens are read or how methods are scored. A method
# may set its own train.batch_size (the micro-batch, e.g. a smaller one for LoRA) as long as its
# step reads the same sequences (checked on the validated configs: _check_same_batches).
SHARED_SECTIONS = ("base", "data", "eval")
SHARED_TRAIN_KEYS = ("max_steps", "tokens_per_step", "seq_len", "seed")


def _check_fair(entry: MethodEntry, where: str, i: int) -> None:
    bad = [k for k in entry.overrides if k in SHARED_SECTIONS]
    train = entry.overrides.get("train", {})
    if isinstance(train, Mapping):
        bad += [f"train.{k}" for k in train if k in SHARED_TRAIN_KEYS]
    if bad:
        raise ConfigError(
            f"{where}: methods[{i}] ({entry.method!r}) sets {', '.join(bad)}; every method of an "
            "experiment must read the same base, data, batches and evaluation. Set them at the "
            "top of the file"
        )


def load_experiment(
    path: str | Path, overrides: Iterable[str] = (), plugins: Iterable[str] = ()
) -> tuple[str, list[ProbeConfig]]:
    """(experiment name, one validated :class:`ProbeConfig` per method) from an experiment file.

    ``--set`` overrides apply to the shared settings of every method; a method's own keys win.
    """
    raw = with_plugins(read_probe_file(path), plugins)
    entries = _entries(raw.pop("methods", None), str(path))
    name = str(raw.pop("name", "") or Path(path).stem)
    shared = apply_overrides(raw, overrides)
    configs, seen, notes = [], set(), []
    for i, entry in enumerate(entries):
        _check_fair(entry, str(path), i)
        try:
            cfg = validate_probe(_method_raw(shared, entry, notes), notes)
        except ConfigError as e:
            raise ConfigError(f"{path}: methods[{i}] ({entry.method!r}): {e}") from None
        if cfg.label in seen or cfg.dir_name in seen:
            raise ConfigError(
                f"{path}: method {cfg.label!r} appears twice (or shares the run directory "
                f"runs/{cfg.dir_name} with another); give one of them a distinct 'name'"
            )
        seen.update((cfg.label, cfg.dir_name))
        _check_same_batches(cfg, configs[0] if configs else cfg, str(path), i)
        configs.append(cfg)
    _deliver(notes, None)
    return name, configs


def _method_raw(shared: Mapping[str, Any], entry: MethodEntry, notes: list[str]) -> dict[str, Any]:
    """One method's raw config: its own keys over the shared ones, its part tables merged by
    :func:`~attnlab.probe.part_tables.method_tables`."""
    tables = method_tables(shared, entry.overrides, entry.method, notes)
    drop = (OLD_PROBE_PARTS, "probe")
    one = deep_merge(
        {k: v for k, v in shared.items() if k not in drop},
        {k: v for k, v in entry.overrides.items() if k not in drop},
    )
    if tables or "probe" in shared or "probe" in entry.overrides:
        one["probe"] = tables
    one["method"], one["name"] = entry.method, entry.name
    return one


def _check_same_batches(cfg: ProbeConfig, first: ProbeConfig, where: str, i: int) -> None:
    """Every method's step reads the same sequences (its micro-batches may differ)."""
    have, want = cfg.train.plan.sequences, first.train.plan.sequences
    if have != want:
        raise ConfigError(
            f"{where}: methods[{i}] ({cfg.method!r}) reads {have} sequences per step and "
            f"methods[0] {want}; every method of an experiment must read the same batches. Set "
            "train.tokens_per_step at the top of the file (a method may then change "
            "train.batch_size, its micro-batch)"
        )


def dump_probe_toml(cfg: ProbeConfig) -> str:
    """The resolved config as TOML (None values left out: they are the defaults)."""
    return to_toml(cfg.to_dict())
