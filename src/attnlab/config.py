"""The typed configuration tree: ``model``, ``data``, ``train``, ``eval``, ``experiment``.

A config comes from a named preset (``attnlab/presets/NAME.toml``), from a TOML file, or both (a file
may say ``extends = "NAME"``), plus ``--set dotted.key=value`` overrides. Everything is validated at
load time: an unknown key names the nearest valid spelling, a wrong value names the allowed ones, and
an impossible combination is refused with its reason, never deep inside a forward pass.
"""

from __future__ import annotations

import copy
import difflib
import json
import tomllib
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from attnlab.errors import UserError


class ConfigError(UserError, ValueError):
    """A configuration that cannot be used; the message names the key, the cause and the fix."""


#: the largest integer any config field takes (torch sizes and seeds are int64)
INT_MAX = 2**63 - 1


def _scalar_kinds(annotation: Any) -> set[type]:
    """The scalar types among ``int``, ``float`` and ``bool`` a field annotation admits."""
    args = get_args(annotation) or (annotation,)
    return {a for a in args if a in (int, float, bool)}


class Section(BaseModel):
    """Base of every config table: unknown keys are errors, assignment is validated, floats must
    be finite, ``true``/``false`` is no number and a number no ``true``/``false``, and integers
    fit in int64."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _strict_numbers(cls, v: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        kinds = _scalar_kinds(field.annotation) if field is not None else set()
        if kinds == {bool}:
            if not isinstance(v, bool):
                raise PydanticCustomError("bool_expected", "give true or false")
            return v
        if not kinds:
            return v
        if isinstance(v, bool):
            raise PydanticCustomError("bool_not_number", "a boolean is not a number; give a number")
        if isinstance(v, int) and abs(v) > INT_MAX:
            raise PydanticCustomError("int_too_large", f"too large; at most {INT_MAX} (int64)")
        return v


# --------------------------------------------------------------------------------------------- model

Activation = Literal["gelu", "relu", "relu2", "silu"]


class NormConfig(Section):
    """Which normalisation every norm of the stack uses (LayerNorm, RMSNorm or ScaleNorm)."""

    kind: Literal["layernorm", "rmsnorm", "scalenorm"] = "layernorm"
    bias: bool = True
    eps: float = Field(1e-5, gt=0)


class PositionConfig(Section):
    """Positional scheme: absolute (learned, sinusoidal), rotary, or a logit bias (ALiBi, T5)."""

    kind: Literal["none", "learned", "sinusoidal", "rope", "alibi", "t5"] = "learned"
    rope_fraction: float = Field(1.0, gt=0, le=1)
    rope_base: float = Field(10000.0, gt=0)
    t5_buckets: int = Field(32, ge=2)
    t5_max_distance: int = Field(128, ge=2)


class AttentionConfig(Section):
    """Heads, mask and kernel of the attention core."""

    n_heads: int = Field(12, ge=1)
    n_kv_heads: int | None = Field(None, ge=1, description="None = n_heads (MHA); 1 = MQA")
    head_dim: int | None = Field(None, ge=1, description="None = d_model // n_heads")
    mask: Literal["causal", "bidirectional", "prefix", "sliding", "local_global"] = "causal"
    window: int = Field(0, ge=0, description="sliding / local window: keys within this distance")
    global_every: int = Field(0, ge=0, description="local_global: every k-th token is global")
    n_global: int = Field(0, ge=0, description="local_global: the first n tokens are global")
    prefix_len: int = Field(0, ge=0, description="prefix: bidirectional over the first n tokens")
    backend: Literal["auto", "sdpa", "flash", "math"] = "auto"
    qk_norm: bool = False
    dropout: float = Field(0.0, ge=0, lt=1)


class QueryConfig(Section):
    """How the query is formed (SPEC 1.1): linear W_Q, identity, nonlinear or anchored."""

    kind: Literal["linear", "identity", "nonlinear", "anchored"] = "linear"
    ratio: float = Field(0.5, gt=0, description="r = ratio * d for the bottleneck f")
    activation: Activation = "gelu"
    scale_form: bool = Field(
        False, description="nonlinear: realise the /2 by halving the softmax scale (authors' form)"
    )
    anchored_mean: bool = Field(False, description="anchored: (xW_Q + f)/2 instead of xW_Q + f")
    fused: bool = Field(True, description="compute K, V and W1 with one matmul d -> 2 d_kv + r")


class PreProjectionConfig(Section):
    """x~ = x^ + W_down act(W_up x^) before Q, K, V (SPEC 1.2)."""

    enabled: bool = False
    expansion: float = Field(1.25, gt=0)
    activation: Activation = "silu"
    gated: bool = False
    init_std: float = Field(0.01, ge=0)


class ContentSkipConfig(Section):
    """out = x + attn + W_skip x~ (SPEC 1.2)."""

    enabled: bool = False
    init_std: float = Field(1e-4, ge=0)


class IdentityHeadConfig(Section):
    """An extra head whose attention matrix is the identity, with data-dependent head weights."""

    enabled: bool = False


class MixerConfig(Section):
    """Head mixing W_O; ``nonlinear`` makes it an MLP that absorbs the removed MLP blocks' params."""

    nonlinear: bool = False
    activation: Activation = "gelu"
    hidden: int | None = Field(None, ge=1, description="None = sized to the removed MLP params")


class MoEValuesConfig(Section):
    """Universal (looped) layer whose values are a routed mixture of experts (SPEC 1.4)."""

    enabled: bool = False
    n_experts: int = Field(8, ge=1)
    top_k: int = Field(2, ge=1)
    expert_hidden: int | None = Field(None, ge=1, description="None = d_model")
    activation: Activation = "gelu"
    loops: int = Field(6, ge=1)
    aux_loss_coef: float = Field(0.01, ge=0)
    z_loss_coef: float = Field(1e-3, ge=0)


class VirtualHeadsConfig(Section):
    """A convolution over the T x T x H attention image making new heads (SPEC 1.5)."""

    enabled: bool = False
    kernel_size: int = Field(3, ge=1)
    n_virtual: int | None = Field(None, ge=1, description="None = n_heads")
    on: Literal["logits", "probs"] = "logits"
    conv: Literal["1d", "2d"] = "1d"


class FFNConfig(Section):
    """Position-wise feed-forward: GELU/ReLU MLP, SwiGLU, GEGLU or ReLU^2."""

    kind: Literal["gelu", "relu", "relu2", "swiglu", "geglu"] = "gelu"
    ratio: float = Field(4.0, gt=0, description="hidden = ratio * d_model unless hidden is set")
    hidden: int | None = Field(None, ge=1)


class ModelConfig(Section):
    """The whole network: family, widths, and every block part."""

    family: Literal["decoder", "encoder", "encoder_decoder"] = "decoder"
    vocab_size: int = Field(50304, ge=2)
    d_model: int = Field(768, ge=1)
    n_layers: int = Field(12, ge=1)
    n_decoder_layers: int | None = Field(None, ge=1, description="encoder_decoder: decoder depth")
    max_seq_len: int = Field(1024, ge=1)
    bias: bool = False
    tie_embeddings: bool = True
    norm_position: Literal["pre", "post"] = "pre"
    residual_kind: Literal["sequential", "parallel"] = "sequential"
    residual: bool = True
    mlp: bool = True
    dropout: float = Field(0.0, ge=0, lt=1)
    stochastic_depth: float = Field(0.0, ge=0, lt=1)
    init_std: float = Field(0.02, gt=0)
    norm: NormConfig = NormConfig()
    position: PositionConfig = PositionConfig()
    attention: AttentionConfig = AttentionConfig()
    query: QueryConfig = QueryConfig()
    pre_projection: PreProjectionConfig = PreProjectionConfig()
    content_skip: ContentSkipConfig = ContentSkipConfig()
    identity_head: IdentityHeadConfig = IdentityHeadConfig()
    mixer: MixerConfig = MixerConfig()
    moe_values: MoEValuesConfig = MoEValuesConfig()
    virtual_heads: VirtualHeadsConfig = VirtualHeadsConfig()
    ffn: FFNConfig = FFNConfig()

    @property
    def head_dim(self) -> int:
        return self.attention.head_dim or self.d_model // self.attention.n_heads

    @property
    def n_kv_heads(self) -> int:
        return self.attention.n_kv_heads or self.attention.n_heads

    @property
    def ffn_hidden(self) -> int:
        return self.ffn.hidden or int(round(self.ffn.ratio * self.d_model))

    @property
    def needs_attention_matrix(self) -> bool:
        """True when a part reads the T x T probabilities, so no fused (flash) kernel can be used."""
        return self.virtual_heads.enabled

    @model_validator(mode="after")
    def _check_combinations(self) -> ModelConfig:
        a, problems = self.attention, []
        if a.head_dim is None and self.d_model % a.n_heads:
            problems.append(
                f"model.d_model={self.d_model} is not divisible by model.attention.n_heads="
                f"{a.n_heads}; change one or set model.attention.head_dim"
            )
        if self.n_kv_heads > a.n_heads or a.n_heads % self.n_kv_heads:
            problems.append(
                f"model.attention.n_kv_heads={self.n_kv_heads} must divide "
                f"model.attention.n_heads={a.n_heads} (GQA groups query heads over shared K/V)"
            )
        hd = self.head_dim
        if self.query.kind == "identity" and a.n_heads * hd != self.d_model:
            problems.append(
                f"model.query.kind='identity' needs d_model == n_heads * head_dim "
                f"({self.d_model} != {a.n_heads}*{hd}); q = Norm(x) has width d_model"
            )
        if self.query.kind == "nonlinear" and a.n_heads * hd != self.d_model:
            problems.append(
                "model.query.kind='nonlinear' anchors q to Norm(x), so it needs "
                f"d_model == n_heads * head_dim ({self.d_model} != {a.n_heads}*{hd})"
            )
        if self.query.scale_form and self.query.kind != "nonlinear":
            problems.append("model.query.scale_form only applies to model.query.kind='nonlinear'")
        if self.query.scale_form and a.qk_norm:
            problems.append(
                "model.query.scale_form (halving the softmax scale) equals the explicit /2 only "
                "while q enters the logits linearly; with model.attention.qk_norm it does not. "
                "Set model.query.scale_form=false"
            )
        if self.needs_attention_matrix and a.backend == "flash":
            problems.append(
                "model.virtual_heads reads the full attention matrix, which a flash kernel never "
                "forms; set model.attention.backend='auto' or 'math'"
            )
        if a.backend == "flash" and self.position.kind in ("alibi", "t5"):
            problems.append(
                f"model.position.kind='{self.position.kind}' adds a bias to the logits, which the "
                "flash kernel does not take; set model.attention.backend='auto'"
            )
        if a.backend == "flash" and a.mask not in ("causal", "bidirectional"):
            problems.append(
                f"model.attention.mask='{a.mask}' needs an explicit mask, which the flash kernel "
                "does not take; set model.attention.backend='auto'"
            )
        if a.mask == "sliding" and a.window < 1:
            problems.append("model.attention.mask='sliding' needs model.attention.window >= 1")
        if a.mask == "local_global" and (a.window < 1 or not (a.global_every or a.n_global)):
            problems.append(
                "model.attention.mask='local_global' needs model.attention.window >= 1 and "
                "model.attention.global_every or model.attention.n_global > 0"
            )
        if a.mask == "prefix" and a.prefix_len < 1:
            problems.append("model.attention.mask='prefix' needs model.attention.prefix_len >= 1")
        if self.family == "encoder" and a.mask in ("causal", "prefix"):
            problems.append(
                f"model.family='encoder' is bidirectional; model.attention.mask='{a.mask}' would "
                "hide the right context. Use 'bidirectional', 'sliding' or 'local_global'"
            )
        if self.position.kind == "rope":
            rot = int(hd * self.position.rope_fraction)
            if rot < 2 or rot % 2:
                problems.append(
                    f"model.position.rope_fraction={self.position.rope_fraction} gives {rot} "
                    f"rotary dims of head_dim={hd}; it must be an even number >= 2"
                )
        if self.position.kind == "learned" and self.max_seq_len < 1:
            problems.append("model.position.kind='learned' needs model.max_seq_len")
        if self.family == "encoder_decoder" and self.n_decoder_layers is None:
            problems.append("model.family='encoder_decoder' needs model.n_decoder_layers")
        if self.moe_values.enabled:
            if self.moe_values.top_k > self.moe_values.n_experts:
                problems.append(
                    f"model.moe_values.top_k={self.moe_values.top_k} exceeds "
                    f"model.moe_values.n_experts={self.moe_values.n_experts}"
                )
            if self.family != "decoder":
                problems.append("model.moe_values is implemented for model.family='decoder' only")
        if vh_2d_unsafe(self):
            problems.append(
                "model.virtual_heads.conv='2d' looks at later queries and keys; it is only "
                "allowed in model.family='encoder'. Use conv='1d' in causal stacks"
            )
        if self.mixer.nonlinear and self.mlp and self.mixer.hidden is None:
            problems.append(
                "model.mixer.nonlinear sizes itself to the removed MLP blocks, but model.mlp=true "
                "keeps them; set model.mlp=false or give model.mixer.hidden"
            )
        if self.residual_kind == "parallel" and self.norm_position == "post":
            problems.append("model.residual_kind='parallel' is defined for pre-norm blocks only")
        if self.residual_kind == "parallel" and not self.mlp:
            problems.append("model.residual_kind='parallel' needs model.mlp=true")
        if self.residual_kind == "parallel" and not self.residual:
            problems.append(
                "model.residual_kind='parallel' sums x + attention + FFN; it needs model.residual=true"
            )
        if self.residual_kind == "parallel" and self.family == "encoder_decoder":
            problems.append(
                "model.residual_kind='parallel' has no place for cross-attention; use "
                "residual_kind='sequential' with model.family='encoder_decoder'"
            )
        if self.family == "decoder" and a.mask == "bidirectional":
            problems.append(
                "model.family='decoder' is a causal LM; model.attention.mask='bidirectional' would "
                "let it see the tokens it predicts. Use family='encoder' for a bidirectional model"
            )
        if self.family == "encoder_decoder" and a.mask == "prefix":
            problems.append(
                "model.attention.mask='prefix' is for decoder-only prefix LMs; an encoder-decoder "
                "already reads its input bidirectionally"
            )
        vh = self.virtual_heads
        if vh.enabled and (vh.n_virtual or a.n_heads) % self.n_kv_heads:
            problems.append(
                f"model.virtual_heads.n_virtual={vh.n_virtual or a.n_heads} must be a multiple of "
                f"the {self.n_kv_heads} K/V heads (each virtual head reads one K/V group's values)"
            )
        if problems:
            raise ValueError("\n".join(problems))
        return self


def vh_2d_unsafe(cfg: ModelConfig) -> bool:
    """A 2-D conv over (query, key) reads later queries: only safe in a bidirectional encoder."""
    vh = cfg.virtual_heads
    return vh.enabled and vh.conv == "2d" and cfg.family != "encoder"


# ---------------------------------------------------------------------------------------------- data


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
    split_seed: int = Field(0, ge=0, description="seed of the train/validation split by document")


# --------------------------------------------------------------------------------------------- train


class TrainConfig(Section):
    """The from-scratch recipe (SPEC 2.1): AdamW, warmup + cosine, clipping, accumulation."""

    max_steps: int = Field(1000, ge=1)
    seed: int = Field(0, ge=0, description="seed of the batch schedule, init and dropout")
    batch_size: int = Field(8, ge=1, description="sequences per micro-batch per process")
    tokens_per_step: int | None = Field(
        None, ge=1, description="accumulate micro-batches up to this many tokens per step"
    )
    lr: float = Field(6e-4, gt=0)
    min_lr: float = Field(6e-5, ge=0)
    warmup_steps: int = Field(100, ge=0)
    weight_decay: float = Field(0.1, ge=0)
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.95, ge=0, lt=1)
    grad_clip: float = Field(1.0, ge=0)
    eval_every: int = Field(100, ge=1)
    eval_batches: int = Field(8, ge=1)
    checkpoint_every: int = Field(100, ge=1)
    log_every: int = Field(10, ge=1)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    compile: bool = False
    device: str = "auto"
    threads: int | None = Field(None, ge=1)
    spike_factor: float = Field(0.0, ge=0, description="diverged if loss > factor * best (0 = off)")
    parallel: Literal["ddp", "fsdp"] = "ddp"
    objective: Literal["auto", "causal_lm", "masked_lm", "span_corruption"] = "auto"
    mask_prob: float = Field(0.15, gt=0, lt=1)

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        if self.min_lr > self.lr:
            raise ValueError(f"train.min_lr={self.min_lr} exceeds train.lr={self.lr}")
        if self.warmup_steps > self.max_steps:
            raise ValueError(
                f"train.warmup_steps={self.warmup_steps} exceeds train.max_steps={self.max_steps}"
            )
        return self


# ---------------------------------------------------------------------------------------------- eval


class EvalConfig(Section):
    """Which evaluations run after training and how."""

    tasks: list[str] = Field(default_factory=lambda: ["perplexity"])
    limit: int | None = Field(None, ge=1)
    stride: int | None = Field(None, ge=1, description="perplexity sliding-window stride")
    batch_size: int = Field(8, ge=1)


# ---------------------------------------------------------------------------------------- experiment


class ExperimentConfig(Section):
    """Labels of a run inside an experiment (filled in by ``attnlab compare``)."""

    name: str = ""
    variant: str = ""
    seed_index: int = Field(0, ge=0)
    tags: list[str] = Field(default_factory=list)


class Config(Section):
    """The whole configuration tree."""

    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    experiment: ExperimentConfig = ExperimentConfig()

    @model_validator(mode="after")
    def _check_cross(self) -> Config:
        m, d = self.model, self.data
        if m.position.kind == "learned" and d.seq_len > m.max_seq_len:
            raise ValueError(
                f"data.seq_len={d.seq_len} exceeds model.max_seq_len={m.max_seq_len} with learned "
                "positions; raise model.max_seq_len or lower data.seq_len"
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


# ------------------------------------------------------------------------------------------ loading


def preset_names() -> list[str]:
    """Names of the bundled presets."""
    root = resources.files("attnlab") / "presets"
    return sorted(p.name[: -len(".toml")] for p in root.iterdir() if p.name.endswith(".toml"))


def _read_toml(text: str, where: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{where}: not valid TOML ({e}); fix the syntax at that line") from None
    except RecursionError:
        raise ConfigError(f"{where}: TOML nested too deeply to read; flatten it") from None


def read_toml_file(path: str | Path, what: str = "config file") -> dict[str, Any]:
    """A TOML file as a dict; a missing file, non-UTF-8 bytes or bad syntax is a ConfigError."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{what} {str(path)!r} does not exist; check the path")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{what} {str(path)!r} is not UTF-8 text; save it as UTF-8") from None
    return _read_toml(text, str(path))


def _preset_dict(name: str, _seen: tuple[str, ...] = ()) -> dict[str, Any]:
    if name in _seen:
        raise ConfigError(f"preset {name!r} extends itself through {' -> '.join(_seen)}")
    path = resources.files("attnlab") / "presets" / f"{name}.toml"
    if not path.is_file():
        near = difflib.get_close_matches(name, preset_names(), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(map(repr, near))}?" if near else ""
        raise ConfigError(
            f"unknown preset {name!r}{hint} Presets: {', '.join(preset_names())}. "
            "A file path must exist and end in .toml"
        )
    raw = _read_toml(path.read_text(encoding="utf-8"), f"preset {name}")
    return _resolve_extends(raw, (*_seen, name))


def _resolve_extends(raw: dict[str, Any], seen: tuple[str, ...] = ()) -> dict[str, Any]:
    parent = raw.pop("extends", None)
    if parent is None:
        return raw
    if not isinstance(parent, str):
        raise ConfigError(f"'extends' must be a preset name string, got {parent!r}")
    return deep_merge(_preset_dict(parent, seen), raw)


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Recursively merge ``over`` into a copy of ``base`` (tables merge, values replace)."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def source_dict(name_or_path: str | Path) -> dict[str, Any]:
    """The raw (unvalidated) dict of a preset name or a TOML file, with ``extends`` resolved."""
    s = str(name_or_path)
    if s.endswith(".toml") or Path(s).exists():
        if Path(s).is_dir():
            raise ConfigError(f"config {s!r} is a directory; give a TOML file or a preset name")
        if not Path(s).is_file():
            raise ConfigError(f"config file {s!r} does not exist; give a preset name or a path")
        return _resolve_extends(read_toml_file(s))
    return _preset_dict(s)


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` -> (["a","b","c"], value); the value is read as TOML, else as a string;
    ``null`` resets an optional field to None (``none`` stays a string: it is a valid choice of
    some keys, e.g. model.position.kind)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like dotted.key=value")
    key, _, text = item.partition("=")
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {item!r} has an empty key part")
    text = text.strip()
    if text == "null":
        return key.split("."), None
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        value = text
    except RecursionError:
        raise ConfigError(f"override {key!r}: the value is nested too deeply to read") from None
    return key.split("."), value


def apply_overrides(raw: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply ``dotted.key=value`` strings to a deep copy of a raw config dict."""
    out = copy.deepcopy(dict(raw))
    for item in overrides:
        path, value = parse_override(item)
        node = out
        for part in path[:-1]:
            nxt = node.get(part)
            if not isinstance(nxt, dict):
                nxt = {}
                node[part] = nxt
            node = nxt
        node[path[-1]] = value
    return out


def fields_at(root: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Valid field names of the table at ``loc`` in the ``root`` schema; list indices are stepped
    over and ``list[Model]`` / ``Model | None`` fields are followed into the model."""
    cls = root
    for part in loc:
        if isinstance(part, int):
            continue
        field = cls.model_fields.get(str(part))
        if field is None:
            break
        ann = field.annotation
        args = get_args(ann) or (ann,)
        models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        if not models:
            break
        cls = models[0]
    return list(cls.model_fields)


def explain(
    err: ValidationError, root: type[BaseModel] | None = None, title: str = "invalid config"
) -> str:
    """One readable line per problem: unknown keys with the nearest valid spelling, values with
    the allowed choices, impossible combinations with their reason. ``root`` is the schema the
    error came from (default :class:`Config`); probe and experiment files reuse this."""
    root = root or Config
    lines = []
    for e in err.errors():
        loc = tuple(str(p) for p in e["loc"])
        dotted = ".".join(loc) or "(root)"
        kind = e["type"]
        if kind == "extra_forbidden":
            valid = fields_at(root, loc[:-1])
            near = difflib.get_close_matches(loc[-1], valid, n=1, cutoff=0.4)
            hint = f" did you mean '{'.'.join((*loc[:-1], near[0]))}'?" if near else ""
            lines.append(f"unknown key '{dotted}'.{hint} Valid keys here: {', '.join(valid)}")
        elif kind == "literal_error":
            expected = e.get("ctx", {}).get("expected", "")
            lines.append(f"'{dotted}' = {e['input']!r} is not allowed; choose one of {expected}")
        elif kind == "value_error":
            msg = str(e.get("ctx", {}).get("error", e["msg"]))
            lines.extend(f"impossible combination: {part}" for part in msg.split("\n"))
        else:
            lines.append(f"'{dotted}' = {e['input']!r}: {e['msg']}")
    return f"{title}:\n  - " + "\n  - ".join(lines)


def validate(raw: Mapping[str, Any]) -> Config:
    """Turn a raw dict into a validated :class:`Config`, or raise :class:`ConfigError`."""
    try:
        return Config.model_validate(dict(raw))
    except ValidationError as e:
        raise ConfigError(explain(e)) from None


def load_config(name_or_path: str | Path | None = None, overrides: Iterable[str] = ()) -> Config:
    """Load a preset or TOML file (or the defaults when None), apply overrides, validate."""
    raw = source_dict(name_or_path) if name_or_path is not None else {}
    return validate(apply_overrides(raw, overrides))


def dump_toml(cfg: Config) -> str:
    """Serialise a config to TOML (None values are left out; they are the defaults)."""
    return _to_toml(cfg.to_dict())


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)  # JSON's escapes are valid TOML basic strings
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def _to_toml(d: Mapping[str, Any], prefix: str = "") -> str:
    scalars = [
        f"{k} = {_toml_value(v)}" for k, v in d.items() if not isinstance(v, dict) and v is not None
    ]
    out = []
    if scalars:
        if prefix:
            out.append(f"[{prefix}]")
        out.extend(scalars)
        out.append("")
    for k, v in d.items():
        if isinstance(v, dict):
            out.append(_to_toml(v, f"{prefix}.{k}" if prefix else k))
    return "\n".join(out)
