"""The typed configuration tree: ``model``, ``data``, ``train``, ``eval``, ``experiment``, and
:func:`validate`, which turns a raw dict into it.

Everything is validated at load time: an unknown key names the nearest valid spelling, a wrong
value names the allowed ones, and an impossible combination is refused with its reason, never deep
inside a forward pass (:mod:`attnlab.config.explain` words the messages).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from attnlab.base.section import Section, seed_type
from attnlab.config.errors import ConfigError
from attnlab.config.explain import explain
from attnlab.config.model_schema import ModelConfig
from attnlab.config.plugins import load_config_plugins
from attnlab.recipe import TrainRecipe


class DataConfig(Section):
    """Where tokens come from: a corpus, a tokenizer, and the prepared shard directory."""

    corpus: str = Field("wiki-sample", description="a source name, a local path or glob, hf:NAME")
    tokenizer: str = Field("bytes", description="bytes, bpe-4096, bpe-8192, gpt2, pythia, a path")
    dir: str | None = Field(None, description="prepared shards; None = data/<corpus>-<tokenizer>")
    seq_len: int = Field(256, ge=2)
    val_fraction: float = Field(0.05, gt=0, lt=1)
    replace_invalid_utf8: bool = False
    max_documents: int | None = Field(None, ge=1)
    text_field: str = Field("text", description=".jsonl/.parquet field holding the text")
    split_seed: seed_type("seed of the train/validation split by document") = 0


def _registered_objective(name: str) -> str:
    """``train.objective``: ``auto`` or the objective of a registered family."""
    from attnlab.parts import families

    known = ["auto", *dict.fromkeys(s.family.objective.name for s in families.specs())]
    if name not in known:
        raise PydanticCustomError(
            "literal_error", "Input should be {expected}", {"expected": ", ".join(map(repr, known))}
        )
    return name


#: ``train.objective``: ``auto`` or a registered family's objective name
ObjectiveName = Annotated[str, AfterValidator(_registered_objective)]


class TrainConfig(TrainRecipe):
    """Pretraining's ``[train]``: the shared recipe (:mod:`attnlab.recipe`, with its defaults: the
    from-scratch recipe of SPEC 2.1) plus what only pretraining has."""

    eval_batches: int = Field(8, ge=1, description="micro-batches of fixed validation sequences")
    compile: bool = False
    parallel: Literal["ddp", "fsdp"] = "ddp"
    objective: ObjectiveName = Field(
        "auto",
        description="auto: the model family's own; else a registered family's objective "
        "(causal_lm, masked_lm, span_corruption, a plugin family's)",
    )
    mask_prob: float = Field(0.15, gt=0, lt=1)
    init_from: str | None = Field(
        None,
        description="start from a GPT-2/GPT-NeoX/Llama checkpoint's weights (hf:NAME or a local "
        "folder); set by `attnlab train --init-from`, which also sets [model] to match it",
    )


class EvalConfig(Section):
    """Which evaluations run after training and how."""

    tasks: list[str] = Field(default_factory=lambda: ["perplexity"])
    limit: int | None = Field(None, ge=1)
    stride: int | None = Field(None, ge=1, description="perplexity sliding-window stride")
    lengths: list[int] | None = Field(
        None,
        description="perplexity at each of these lengths (train short, test long); `attnlab "
        "eval --lengths` and compare reports read it",
    )
    batch_size: int = Field(8, ge=1)


class ExperimentConfig(Section):
    """Labels of a run inside an experiment (filled in by ``attnlab compare``)."""

    name: str = ""
    variant: str = ""
    seed_index: int = Field(0, ge=0)
    tags: list[str] = Field(default_factory=list)


class Config(Section):
    """The whole configuration tree. ``plugins`` lists the modules or .py files whose parts the
    config uses (loaded before the rest is validated; stored resolved to absolute paths)."""

    plugins: list[str] = Field(default_factory=list)
    model: ModelConfig = Field(default_factory=lambda: ModelConfig())
    data: DataConfig = DataConfig()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    experiment: ExperimentConfig = ExperimentConfig()

    @model_validator(mode="after")
    def _check_cross(self) -> Config:
        m, d = self.model, self.data
        limit = m.position_limit
        if limit is not None and d.seq_len > limit:
            raise ValueError(
                f"data.seq_len={d.seq_len} exceeds model.max_seq_len={m.max_seq_len} with "
                f"{limit} {m.position_limit_noun} (model.position.kind={m.position.kind!r}); "
                "raise model.max_seq_len or lower data.seq_len"
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def __reduce__(self):
        """Pickled as its dict and validated again on unpickling, so another process (a
        ``--jobs`` worker, a Slurm job) loads the config's plugins before their parts' options
        classes are needed."""
        return (validate, (self.to_dict(),))


def validate(raw: Mapping[str, Any], notes: list[str] | None = None) -> Config:
    """Turn a raw dict into a validated :class:`Config` (loading its ``plugins`` first), or
    raise :class:`ConfigError`. What validation notes (an option a slot's new kind lacks,
    dropped) goes into ``notes`` when given, else out as a :class:`DroppedOptionWarning`."""
    raw = load_config_plugins(dict(raw))
    context = {"notes": notes} if notes is not None else None
    try:
        return Config.model_validate(raw, context=context)
    except ValidationError as e:
        raise ConfigError(explain(e, Config, raw=raw)) from None
