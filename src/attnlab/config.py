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
import warnings
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, Field, ValidationError, ValidationInfo, model_validator
from pydantic_core import PydanticCustomError

from attnlab.base.errors import UserError
from attnlab.base.pathkind import not_a_file
from attnlab.base.schema import PartOptions, Section, default_options, slot_field, slot_of
from attnlab.base.section import seed_type
from attnlab.recipe import TrainRecipe


class ConfigError(UserError, ValueError):
    """A configuration that cannot be used; the message names the key, the cause and the fix."""


# --------------------------------------------------------------------------------------------- model


class AttentionConfig(Section):
    """Heads, mask and kernel of the attention core."""

    n_heads: int = Field(12, ge=1)
    n_kv_heads: int | None = Field(None, ge=1, description="None = n_heads (MHA); 1 = MQA")
    head_dim: int | None = Field(None, ge=1, description="None = d_model // n_heads")
    mask: Literal["causal", "bidirectional", "prefix", "sliding", "local_global", "bigbird"] = (
        "causal"
    )
    window: int = Field(0, ge=0, description="sliding / local window: keys within this distance")
    global_every: int = Field(0, ge=0, description="local_global: every k-th token is global")
    n_global: int = Field(0, ge=0, description="local_global: the first n tokens are global")
    prefix_len: int = Field(0, ge=0, description="prefix: bidirectional over the first n tokens")
    block_size: int = Field(16, ge=1, description="bigbird: tokens per block of the random pattern")
    random_blocks: int = Field(0, ge=0, description="bigbird: random key blocks per query block")
    random_seed: seed_type(
        "bigbird: seed of the random blocks (stored: run, resume, export agree)"
    ) = 0
    backend: Literal["auto", "sdpa", "flash", "math"] = Field(
        "auto",
        description="auto: torch picks the SDPA kernel; flash: FlashAttention only; sdpa: any "
        "fused kernel, never the unfused fallback; math: attnlab's explicit (materialised) path",
    )
    fuse_qkv: bool = Field(
        True, description="run the Q, K, V parts as one matmul when every one of them can"
    )
    qk_norm: bool = False
    dropout: float = Field(0.0, ge=0, lt=1)


FeatureMapSlot = slot_field("feature_map")
QuerySlot = slot_field("query")
KeySlot = slot_field("key")
ValueSlot = slot_field("value")
ScoreSlot = slot_field("score")
ReadoutSlot = slot_field("readout")
MixerSlot = slot_field("mixer")
SideBranchSlot = slot_field("side_branch")
FFNSlot = slot_field("ffn")
PositionSlot = slot_field("position")
NormSlot = slot_field("norm")
CrossAttentionSlot = slot_field("cross_attention")

#: the slot tables of a model config, in block order (see ``attnlab.parts.slots``)
SLOT_FIELDS = (
    "feature_map",
    "query",
    "key",
    "value",
    "score",
    "readout",
    "mixer",
    "side_branch",
    "ffn",
    "position",
    "norm",
    "cross_attention",
)

#: option keys of ``[model.position]`` before positions were a slot -> (kind, the new key); a
#: recorded config held all of them whatever its kind, so the other kinds' ones are dropped
LEGACY_POSITION_KEYS = {
    "rope_fraction": ("rope", "fraction"),
    "rope_base": ("rope", "base"),
    "t5_buckets": ("t5", "buckets"),
    "t5_max_distance": ("t5", "max_distance"),
}


def _legacy_position(table: Any, kind: Any = None) -> Any:
    """An old ``[model.position]`` table in the slot's form (new key names, no stray keys);
    ``kind`` is the position kind when the table names none (a layer merged over another).
    An old name beside its new one is refused, naming both: one of them would be lost."""
    if not isinstance(table, Mapping) or not any(k in table for k in LEGACY_POSITION_KEYS):
        return table
    kind = table.get("kind", kind or "learned")
    both = [
        (old, new) for old, (_, new) in LEGACY_POSITION_KEYS.items() if {old, new} <= set(table)
    ]
    if both:
        old, new = both[0]
        raise ConfigError(
            f"model.position.{old} = {cut_repr(table[old])} and model.position.{new} = "
            f"{cut_repr(table[new])} set the same option ({old} is the old name of {new}); "
            f"keep only model.position.{new}"
        )
    out = {k: v for k, v in table.items() if k not in LEGACY_POSITION_KEYS}
    for old, (owner, new) in LEGACY_POSITION_KEYS.items():
        if old in table and owner == kind:
            out[new] = table[old]
            _set_explicitly(out, [new])
    return out


class RetrievalConfig(Section):
    """``model.family = "retrieval"`` (RETRO, Borgeaud et al. 2022): chunked cross-attention from
    the chosen decoder layers to an encoder over k retrieved neighbours per chunk of m tokens.
    Neighbours are built by ``attnlab data retrieval`` with the same ``chunk_size``, ``neighbours``
    and ``continuation`` (``attnlab.data.retrieval``)."""

    chunk_size: int = Field(16, ge=2, description="m: tokens per chunk (data.seq_len % m == 0)")
    neighbours: int = Field(2, ge=1, description="k: neighbours retrieved per chunk")
    continuation: int | None = Field(
        None, ge=0, description="tokens kept after each neighbour chunk (None: m, as in RETRO)"
    )
    encoder_layers: int = Field(1, ge=1, description="bidirectional layers over each neighbour")
    cca_layers: list[int] | None = Field(
        None, description="0-based decoder layers with CCA (None: every 3rd from layer 1, RETRO)"
    )

    @property
    def neighbour_len(self) -> int:
        """r = m + continuation: tokens in one retrieved neighbour."""
        return self.chunk_size + (
            self.chunk_size if self.continuation is None else self.continuation
        )

    def layers(self, n_layers: int) -> list[int]:
        """The decoder layers that read the neighbours."""
        if self.cca_layers is not None:
            return sorted(set(self.cca_layers))
        return list(range(min(1, n_layers - 1), n_layers, 3))


class ModelConfig(Section):
    """The whole network: family, widths, structure, and the part in every slot of the block.

    Each slot table names a registered part (``kind``) and holds that part's own options, e.g.
    ``[model.query] kind = "nonlinear"; ratio = 0.5``. ``attnlab parts`` lists what can go where.
    """

    family: Literal["decoder", "encoder", "encoder_decoder", "retrieval"] = "decoder"
    vocab_size: int = Field(50304, ge=2)
    d_model: int = Field(768, ge=1)
    n_layers: int = Field(12, ge=1)
    n_decoder_layers: int | None = Field(None, ge=1, description="encoder_decoder: decoder depth")
    loops: int = Field(1, ge=1, description="run the layers this many times with shared weights")
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
    norm: NormSlot = default_options("norm")
    position: PositionSlot = default_options("position")
    attention: AttentionConfig = AttentionConfig()
    retrieval: RetrievalConfig = RetrievalConfig()
    feature_map: FeatureMapSlot = default_options("feature_map")
    query: QuerySlot = default_options("query")
    key: KeySlot = default_options("key")
    value: ValueSlot = default_options("value")
    score: ScoreSlot = default_options("score")
    readout: ReadoutSlot = default_options("readout")
    mixer: MixerSlot = default_options("mixer")
    side_branch: SideBranchSlot = default_options("side_branch")
    ffn: FFNSlot = default_options("ffn")
    #: retrieval's chunked cross-attention (``cca`` when a retrieval config names none)
    cross_attention: CrossAttentionSlot = default_options("cross_attention")

    @model_validator(mode="before")
    @classmethod
    def _load_parts(cls, data: Any, info: ValidationInfo) -> Any:
        """Import the part registry (it installs itself as the slots' lookup) before a slot
        table is validated or a default part is made; settle the options a slot table carried
        over from another kind (:func:`settle_carried`)."""
        from attnlab.parts import registry  # noqa: F401

        if isinstance(data, Mapping) and "position" in data:
            try:
                data = {**data, "position": _legacy_position(data["position"])}
            except ConfigError as e:
                raise PydanticCustomError("same_option", "{message}", {"message": str(e)}) from None
        if isinstance(data, Mapping):
            data, notes = settle_carried(data)
            _deliver_notes(notes, info.context)
        if isinstance(data, Mapping) and data.get("family") == "retrieval":
            table = data.get("cross_attention")  # a retrieval config from before the slot
            if table is None or (isinstance(table, Mapping) and "kind" not in table):
                data = {**data, "cross_attention": {"kind": "cca", **(table or {})}}
        return data

    @property
    def head_dim(self) -> int:
        return self.attention.head_dim or self.d_model // self.attention.n_heads

    @property
    def n_kv_heads(self) -> int:
        return self.attention.n_kv_heads or self.attention.n_heads

    @property
    def ffn_hidden(self) -> int:
        """Hidden width of the FFN (its ``hidden``, else ``ratio * d_model``)."""
        width = getattr(self.ffn, "width", None)
        if width is None:
            raise ConfigError(f"model.ffn.kind={self.ffn.kind!r} has no hidden width option")
        return width(self.d_model)

    def slots(self) -> dict[str, PartOptions]:
        """slot name -> the options of the part in it."""
        return {name: getattr(self, name) for name in SLOT_FIELDS}

    def part_classes(self) -> dict[str, type]:
        """slot name -> the registered part class of its kind (None for an empty slot)."""
        from attnlab.parts import registry

        out = {}
        for name, opts in self.slots().items():
            spec = registry.get(name, opts.kind)
            out[name] = None if spec.kind == "none" else spec.cls
        return out

    @property
    def position_limit(self) -> int | None:
        """The longest sequence the position part can place (e.g. a learned table's
        ``max_seq_len``); None: no limit, evaluation and generation may go past training."""
        cls = self.part_classes()["position"]
        return None if cls is None else cls.length_limit(self.position, self)

    @property
    def position_limit_noun(self) -> str:
        """What the position part's limit counts, for messages (e.g. "learned positions")."""
        cls = self.part_classes()["position"]
        return "positions" if cls is None else cls.limit_noun

    @property
    def needs_attention_matrix(self) -> bool:
        """True when a part reads the T x T probabilities, so no fused (flash) kernel is used."""
        return any(c is not None and c.needs_attention_matrix for c in self.part_classes().values())

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
        if problems:  # the parts' own checks assume consistent head shapes
            raise ValueError("\n".join(problems))
        for opts in self.slots().values():
            problems.extend(opts.check(self))
        if self.needs_attention_matrix and a.backend in ("flash", "sdpa"):
            names = [k for k, c in self.part_classes().items() if c and c.needs_attention_matrix]
            problems.append(
                f"model.{names[0]}.kind={getattr(self, names[0]).kind!r} reads the full attention "
                f"matrix, which a fused kernel never forms; set model.attention.backend='auto' "
                "or 'math'"
            )
        position = self.part_classes()["position"]
        if a.backend == "flash" and position is not None and position.logit_bias:
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
        if a.mask == "bigbird" and (a.window < 1 or a.random_blocks < 1):
            problems.append(
                "model.attention.mask='bigbird' needs model.attention.window >= 1 and "
                "model.attention.random_blocks >= 1 (global tokens: n_global / global_every)"
            )
        if a.mask == "prefix" and a.prefix_len < 1:
            problems.append("model.attention.mask='prefix' needs model.attention.prefix_len >= 1")
        if self.family == "encoder" and a.mask in ("causal", "prefix"):
            problems.append(
                f"model.family='encoder' is bidirectional; model.attention.mask='{a.mask}' would "
                "hide the right context. Use 'bidirectional', 'sliding' or 'local_global'"
            )
        if self.family == "encoder_decoder" and self.n_decoder_layers is None:
            problems.append("model.family='encoder_decoder' needs model.n_decoder_layers")
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
        problems += self._retrieval_problems()
        if self.family == "encoder_decoder" and a.mask == "prefix":
            problems.append(
                "model.attention.mask='prefix' is for decoder-only prefix LMs; an encoder-decoder "
                "already reads its input bidirectionally"
            )
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def _retrieval_problems(self) -> list[str]:
        """What the retrieval family needs (CCA layers that exist, a causal mask, a plain
        residual stack, a cross_attention part) and that no other family sets a cross_attention
        part."""
        a = self.attention
        problems: list[str] = []
        if self.family == "retrieval":
            bad = [i for i in self.retrieval.layers(self.n_layers) if not 0 <= i < self.n_layers]
            if bad:
                problems.append(
                    f"model.retrieval.cca_layers={bad} are not layers of a {self.n_layers}-layer "
                    f"decoder; use indices 0..{self.n_layers - 1}"
                )
            if a.mask == "bidirectional":
                problems.append(
                    "model.family='retrieval' is a causal LM; use model.attention.mask='causal'"
                )
            if self.loops != 1 or self.residual_kind == "parallel" or not self.residual:
                problems.append(
                    "model.family='retrieval' is built for loops=1, residual=true and "
                    "residual_kind='sequential'"
                )
            if self.cross_attention.kind == "none":
                problems.append(
                    "model.family='retrieval' reads its neighbours through a cross_attention part; "
                    "set model.cross_attention.kind='cca' (or a plugin's kind)"
                )
        elif self.cross_attention.kind != "none":
            problems.append(
                f"model.cross_attention.kind={self.cross_attention.kind!r} is read only by "
                f"model.family='retrieval' (this model is {self.family!r}); remove the table"
            )
        return problems


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
    split_seed: seed_type("seed of the train/validation split by document") = 0


# --------------------------------------------------------------------------------------------- train


class TrainConfig(TrainRecipe):
    """Pretraining's ``[train]``: the shared recipe (:mod:`attnlab.recipe`, with its defaults: the
    from-scratch recipe of SPEC 2.1) plus what only pretraining has."""

    eval_batches: int = Field(8, ge=1, description="micro-batches of fixed validation sequences")
    compile: bool = False
    parallel: Literal["ddp", "fsdp"] = "ddp"
    objective: Literal["auto", "causal_lm", "masked_lm", "span_corruption"] = "auto"
    mask_prob: float = Field(0.15, gt=0, lt=1)
    init_from: str | None = Field(
        None,
        description="start from a GPT-2/GPT-NeoX/Llama checkpoint's weights (hf:NAME or a local "
        "folder); set by `attnlab train --init-from`, which also sets [model] to match it",
    )


# ---------------------------------------------------------------------------------------------- eval


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


# ---------------------------------------------------------------------------------------- experiment


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
        raise ConfigError(f"{what} {str(path)!r} {not_a_file(p)}; give the path of a TOML file")
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


def deep_merge(
    base: Mapping[str, Any], over: Mapping[str, Any], _path: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Recursively merge ``over`` into a copy of ``base`` (tables merge, values replace). A slot
    table (``model.<slot>``) whose ``kind`` changes keeps the options the new kind also has
    (:func:`switch_kind`): a preset's ``norm.bias = false`` stays false on another norm."""
    out = dict(base)
    for k, v in over.items():
        old = out.get(k)
        here = (*_path, k)
        if here == ("model", "position") and isinstance(v, Mapping):
            kind = old.get("kind") if isinstance(old, Mapping) else None
            v, old = _legacy_position(v, kind), _legacy_position(old)
        if isinstance(v, Mapping) and isinstance(old, Mapping):
            if _is_slot(here) and "kind" in v and v["kind"] != old.get("kind"):
                out[k] = switch_kind(old, v)
            else:
                out[k] = deep_merge(old, v, here)
                if _is_slot(here):
                    _set_explicitly(out[k], _own_keys(v))
        else:
            out[k] = v
    return out


def _is_slot(path: tuple[str, ...] | list[str]) -> bool:
    return len(path) == 2 and path[0] == "model" and path[1] in SLOT_FIELDS


# ------------------------------------------------------------------ a slot's kind changes

#: a raw slot table's record of the options it carried over from the table of another kind:
#: {option: the kind it was set for (None: the slot's default)}. Written by :func:`switch_kind`,
#: settled and removed when the config is validated (:func:`settle_carried`); never stored.
CARRIED = "__carried_from__"


class DroppedOptionWarning(UserWarning):
    """A preset's (or base's) option that the slot's new kind does not have was dropped."""


def _own_keys(table: Mapping[str, Any]) -> list[str]:
    """The options a table sets itself (not those it carried over)."""
    carried = table.get(CARRIED) or {}
    return [k for k in table if k not in (CARRIED, "kind") and k not in carried]


def _set_explicitly(table: dict[str, Any], keys: Iterable[str]) -> None:
    """``keys`` were set in ``table`` by the user: no longer carried over."""
    carried = table.get(CARRIED)
    if not carried:
        return
    left = {k: v for k, v in carried.items() if k not in set(keys)}
    if left:
        table[CARRIED] = left
    else:
        del table[CARRIED]


def switch_kind(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The slot table of ``new``'s kind over ``old`` (another kind's): ``new``'s keys plus the
    options of ``old`` that ``new`` does not set, carried over and marked (:data:`CARRIED`).
    Validation keeps those the new kind has and drops the others with a note naming them."""
    source = old.get("kind")
    before = old.get(CARRIED) or {}
    carried = {k: v for k, v in old.items() if k not in ("kind", CARRIED) and k not in new}
    out = {**carried, **new}
    marks = {**{k: before.get(k, source) for k in carried}, **(new.get(CARRIED) or {})}
    out.pop(CARRIED, None)
    if marks:
        out[CARRIED] = marks
    return out


def settle_carried(model: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A raw ``[model]`` table with every slot's carried-over options settled. An option still
    at its old kind's default was no choice (a dumped config lists every default): it goes, and
    the new kind's own default applies. Another one stays where the new kind has it and is
    dropped where it does not, with one note per slot naming those."""
    from attnlab.parts import registry

    out, notes = dict(model), []
    for slot in SLOT_FIELDS:
        table = out.get(slot)
        if not isinstance(table, Mapping) or CARRIED not in table:
            continue
        marks = table[CARRIED] if isinstance(table[CARRIED], Mapping) else {}
        table = {k: v for k, v in table.items() if k != CARRIED}
        kind = table.get("kind", registry.default_kind(slot))
        if isinstance(kind, str) and registry.has(slot, kind):
            sources = {k: marks[k] or registry.default_kind(slot) for k in marks if k in table}
            for k, source in sources.items():
                if _is_default(slot, source, k, table[k]):
                    del table[k]
            have = registry.get(slot, kind).options.model_fields
            dropped = [k for k in sources if k in table and k not in have]
            for k in dropped:
                del table[k]
            if dropped:
                names = ", ".join(repr(k) for k in dropped)
                kinds = " and ".join(repr(s) for s in sorted({sources[k] for k in dropped}))
                notes.append(
                    f"model.{slot}.kind = {kind!r} has no option{'s' if len(dropped) > 1 else ''} "
                    f"{names} (set for kind {kinds}), so "
                    f"{'they were' if len(dropped) > 1 else 'it was'} dropped"
                )
        out[slot] = table
    return out, notes


def _is_default(slot: str, kind: str, key: str, value: Any) -> bool:
    """``value`` is the default of option ``key`` of part ``kind`` (same type, same value)."""
    from attnlab.parts import registry

    if not registry.has(slot, kind):
        return False
    field = registry.get(slot, kind).options.model_fields.get(key)
    if field is None or field.is_required():
        return False
    default = field.get_default(call_default_factory=True)
    return type(default) is type(value) and default == value


def _deliver_notes(notes: list[str], context: Any) -> None:
    """Into the validation context's ``notes`` list when the caller gave one (compare reports
    them per variant), else as a warning (one ``attnlab CMD: warning:`` line each)."""
    if isinstance(context, dict) and isinstance(context.get("notes"), list):
        context["notes"].extend(n for n in notes if n not in context["notes"])
        return
    for note in notes:
        warnings.warn(note, DroppedOptionWarning, stacklevel=2)


def source_dict(name_or_path: str | Path) -> dict[str, Any]:
    """The raw (unvalidated) dict of a preset name or a TOML file, with ``extends`` resolved."""
    s = str(name_or_path)
    if s.endswith(".toml") or Path(s).exists():
        if Path(s).is_dir():
            raise ConfigError(f"config {s!r} is a directory; give a TOML file or a preset name")
        if not Path(s).is_file():
            raise ConfigError(f"config file {s!r} {not_a_file(s)}; give a preset name or a path")
        return _resolve_extends(resolve_plugin_paths(read_toml_file(s), Path(s).parent))
    return _preset_dict(s)


def resolve_plugin_paths(raw: dict[str, Any], base_dir: str | Path) -> dict[str, Any]:
    """A file's ``plugins`` with relative paths read from the file's directory."""
    specs = raw.get("plugins")
    if not isinstance(specs, list):
        return raw
    from attnlab.parts.plugins import resolve_spec

    return {
        **raw,
        "plugins": [resolve_spec(p, base_dir) if isinstance(p, str) else p for p in specs],
    }


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
    """Apply ``dotted.key=value`` strings to a deep copy of a raw config dict.

    ``model.<slot>.kind=...`` overrides apply first; one that changes the part keeps the
    options the new kind also has (:func:`switch_kind`), and the other overrides of that table
    then apply on top. Two overrides of one option (the same key with two values, or an old
    key name beside its new one) are refused, naming both."""
    out = copy.deepcopy(dict(raw))
    model = out.get("model")
    if isinstance(model, dict) and isinstance(model.get("position"), Mapping):
        model["position"] = _legacy_position(model["position"])  # today's names, then --set
    items = list(overrides)
    parsed = [_current_name(*parse_override(item)) for item in items]
    _refuse_repeats(items, parsed)
    kinds = [(p, v) for p, v in parsed if p[-1] == "kind" and _is_slot(p[:-1])]
    for path, value in kinds + [(p, v) for p, v in parsed if (p, v) not in kinds]:
        parent, node = out, out
        for part in path[:-1]:
            nxt = node.get(part)
            if not isinstance(nxt, dict):
                nxt = {}
                node[part] = nxt
            parent, node = node, nxt
        key, table = path[-1], tuple(path[:-1])
        if _is_slot(table) and key == "kind":
            if value != node.get("kind"):
                parent[path[-2]] = switch_kind(node, {"kind": value})
        elif _is_slot(tuple(path)) and isinstance(value, Mapping):
            node[key] = deep_merge(node, {key: value}, table)[key]  # a whole table: as a file's
        else:
            node[key] = value
            if _is_slot(table):
                _set_explicitly(node, [key])
    return out


def _current_name(path: list[str], value: Any) -> tuple[list[str], Any]:
    """An override of an old ``model.position`` key under today's name (``rope_base`` ->
    ``base``), so it replaces a preset's value instead of losing to it."""
    if len(path) == 3 and path[:2] == ["model", "position"] and path[2] in LEGACY_POSITION_KEYS:
        return [*path[:2], LEGACY_POSITION_KEYS[path[2]][1]], value
    return path, value


def _refuse_repeats(
    items: list[str], parsed: list[tuple[list[str], Any]], same_key: bool = False
) -> None:
    """Two overrides of one option (an old key name beside its new one; with ``same_key`` also
    one key with two values) are refused, naming both."""
    seen: dict[tuple[str, ...], tuple[str, Any]] = {}
    for item, (path, value) in zip(items, parsed):
        first = seen.setdefault(tuple(path), (item, value))
        named = [i.partition("=")[0].strip() for i in (first[0], item)]
        if first[0] == item or (named[0] == named[1] and not same_key):
            continue
        if named[0] == named[1] and type(first[1]) is type(value) and first[1] == value:
            continue
        why = "two values for one key"
        if named[0] != named[1]:
            old = [n for n in named if n.rsplit(".", 1)[-1] in LEGACY_POSITION_KEYS]
            why = f"{old[0] if old else named[0]} is the old name of {'.'.join(path)}"
        raise ConfigError(
            f"{first[0].strip()!r} and {item.strip()!r} both set {'.'.join(path)} "
            f"({why}); keep one of them"
        )


def check_distinct(overrides: Iterable[str]) -> None:
    """Refuse a list of ``key=value`` items a user wrote (``--set``, an experiment's ``set``)
    that sets one option twice: one key with two values, or an old key name beside its new one
    (the first would be lost without a word). :class:`ConfigError` names both."""
    items = [i for i in overrides if "=" in i]
    parsed = []
    for item in items:
        try:
            parsed.append(_current_name(*parse_override(item)))
        except ConfigError:
            parsed.append(([f"\0{item}"], None))  # refused with its own message when applied
    _refuse_repeats(items, parsed, same_key=True)


def _raw_at(raw: Mapping[str, Any] | None, loc: tuple[Any, ...]) -> Any:
    node: Any = raw
    for part in loc:
        if isinstance(node, Mapping):
            node = node.get(part)
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            return None
    return node


def schema_at(
    root: type[BaseModel], loc: tuple[Any, ...], raw: Mapping[str, Any] | None = None
) -> type[BaseModel]:
    """The model class of the table at ``loc`` in the ``root`` schema; list indices are stepped
    over, ``list[Model]`` / ``Model | None`` fields are followed into the model, and a slot table
    is the options class of the part its ``kind`` (read from ``raw``) names."""
    cls = root
    for i, part in enumerate(loc):
        if isinstance(part, int):
            continue
        field = cls.model_fields.get(str(part))
        if field is None:
            break
        slot = slot_of(field)
        if slot is not None:
            from attnlab.parts import registry

            table = _raw_at(raw, loc[: i + 1])
            kind = table.get("kind") if isinstance(table, Mapping) else None
            kind = kind if isinstance(kind, str) else registry.default_kind(slot)
            if not registry.has(slot, kind):
                break
            cls = registry.get(slot, kind).options
            continue
        ann = field.annotation
        args = get_args(ann) or (ann,)
        models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        if not models:
            break
        cls = models[0]
    return cls


def fields_at(
    root: type[BaseModel], loc: tuple[Any, ...], raw: Mapping[str, Any] | None = None
) -> list[str]:
    """Valid field names of the table at ``loc`` (see :func:`schema_at`)."""
    return list(schema_at(root, loc, raw).model_fields)


#: keys of earlier attnlab versions -> what replaced them (named in the unknown-key message)
RENAMED = {
    "model.pre_projection": "[model.feature_map] kind = 'pre_projection'",
    "model.content_skip": "[model.side_branch] kind = 'content_skip'",
    "model.identity_head": "[model.readout] kind = 'identity_head'",
    "model.virtual_heads": "[model.score] kind = 'virtual_heads'",
    "model.moe_values": "[model.value] kind = 'moe' (and model.loops for the looped layer)",
    "model.query.fused": "model.attention.fuse_qkv",
    "model.query.anchored_mean": "model.query.mean (with kind = 'anchored')",
    "model.mixer.nonlinear": "[model.mixer] kind = 'nonlinear'",
}


def explain(
    err: ValidationError,
    root: type[BaseModel] | None = None,
    title: str = "invalid config",
    raw: Mapping[str, Any] | None = None,
) -> str:
    """One readable line per problem: unknown keys with the nearest valid spelling, values with
    the allowed choices, impossible combinations with their reason. ``root`` is the schema the
    error came from (default :class:`Config`), ``raw`` the dict that was validated (it says which
    part a slot table holds); probe and experiment files reuse this."""
    root = root or Config
    lines = []
    for e in err.errors():
        loc = tuple(str(p) if not isinstance(p, int) else p for p in e["loc"])
        dotted = ".".join(map(str, loc)) or "(root)"
        kind = e["type"]
        if kind == "extra_forbidden":
            parent = ".".join(map(str, loc[:-1]))
            cls = schema_at(root, loc[:-1], raw)
            valid = list(cls.model_fields)
            olds = {
                k.rsplit(".", 1)[-1]: v for k, v in RENAMED.items() if k.rsplit(".", 1)[0] == parent
            }
            near = difflib.get_close_matches(str(loc[-1]), [*valid, *olds], n=1, cutoff=0.4)
            hint = ""
            if near and near[0] in olds:
                hint = f" did you mean '{parent}.{near[0]}'? it is now {olds[near[0]]}."
                if near[0] == loc[-1]:
                    hint = f" it is now {olds[near[0]]}."
            elif near:
                hint = f" did you mean '{'.'.join(map(str, (*loc[:-1], near[0])))}'?"
            where = ""
            if issubclass(cls, PartOptions) and len(loc) >= 2:
                where = f" of {loc[-2]} part {raw_kind(raw, loc[:-1], cls)!r}"
                hint += _other_kinds_hint(root, loc, raw)
            lines.append(
                f"unknown key '{dotted}'{where}.{hint} Valid keys here: {', '.join(valid)}"
            )
        elif kind == "same_option":
            lines.append(e["msg"])
        elif kind == "unknown_part":
            lines.append(f"'{dotted}.kind': {e['ctx']['problem']}")
        elif kind == "literal_error":
            expected = e.get("ctx", {}).get("expected", "")
            lines.append(
                f"'{dotted}' = {cut_repr(e['input'])} is not allowed; choose one of {expected}"
            )
        elif kind == "value_error":
            msg = str(e.get("ctx", {}).get("error", e["msg"]))
            lines.extend(f"impossible combination: {part}" for part in msg.split("\n"))
        else:
            lines.append(f"'{dotted}' = {cut_repr(e['input'])}: {e['msg']}")
    return f"{title}:\n  - " + "\n  - ".join(lines)


def cut_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters with its full length named (a 100 MB string
    in a TOML file is not echoed back)."""
    text = (
        repr(value)
        if not isinstance(value, str | bytes) or len(value) <= 4 * limit
        else (repr(value[:limit]))
    )
    size = len(value) if isinstance(value, str | bytes) else len(text)
    if size <= limit and len(text) <= limit + 2:
        return text
    return f"{text[: limit + 1]}... ({size:,} characters)"


def raw_kind(raw: Mapping[str, Any] | None, loc: tuple[Any, ...], cls: Any = None) -> str:
    table = _raw_at(raw, loc)
    kind = table.get("kind") if isinstance(table, Mapping) else None
    if kind is None and len(loc) >= 1:
        from attnlab.parts import registry
        from attnlab.parts.slots import SLOTS

        if str(loc[-1]) in SLOTS:
            return registry.default_kind(str(loc[-1]))
    return str(kind) if kind is not None else "default"


def _other_kinds_hint(root: type[BaseModel], loc: tuple[Any, ...], raw: Any) -> str:
    """For an option the chosen part lacks: the kinds of that slot that have it."""
    from attnlab.parts import registry
    from attnlab.parts.slots import SLOTS

    slot, key = str(loc[-2]), str(loc[-1])
    if slot not in SLOTS:
        return ""
    have = [s.kind for s in registry.specs(slot) if key in s.options.model_fields]
    if not have:
        return ""
    kinds = " or ".join(repr(k) for k in have)
    return f" '{key}' is an option of {slot} kind {kinds}: set {'.'.join(map(str, loc[:-1]))}.kind."


def load_config_plugins(raw: dict[str, Any], base_dir: str | Path | None = None) -> dict[str, Any]:
    """Load the plugins ``raw`` names (relative paths from ``base_dir``) and return ``raw`` with
    them resolved; every config is validated after its plugins, in every process."""
    specs = raw.get("plugins")
    if specs is None:
        return raw
    if not isinstance(specs, list) or not all(isinstance(p, str) for p in specs):
        raise ConfigError(
            f"'plugins' must be a list of module names or .py file paths, got {specs!r}"
        )
    from attnlab.parts.plugins import load_plugins

    out = dict(raw)
    out["plugins"] = list(dict.fromkeys(load_plugins(specs, base_dir)))
    return out


def validate(raw: Mapping[str, Any], notes: list[str] | None = None) -> Config:
    """Turn a raw dict into a validated :class:`Config` (loading its ``plugins`` first), or
    raise :class:`ConfigError`. What validation notes (an option a slot's new kind lacks,
    dropped) goes into ``notes`` when given, else out as a :class:`DroppedOptionWarning`."""
    raw = load_config_plugins(dict(raw))
    context = {"notes": notes} if notes is not None else None
    try:
        return Config.model_validate(raw, context=context)
    except ValidationError as e:
        raise ConfigError(explain(e, raw=raw)) from None


def with_plugins(raw: dict[str, Any], plugins: Iterable[str] = ()) -> dict[str, Any]:
    """``raw`` with ``plugins`` (e.g. from ``--plugin``, relative to the working directory)
    added to its own list."""
    plugins = list(plugins)
    if not plugins:
        return raw
    from attnlab.parts.plugins import resolve_spec

    have = raw.get("plugins") or []
    return {**raw, "plugins": [*have, *(resolve_spec(p) for p in plugins)]}


def load_config(
    name_or_path: str | Path | None = None,
    overrides: Iterable[str] = (),
    plugins: Iterable[str] = (),
) -> Config:
    """Load a preset or TOML file (or the defaults when None), add ``plugins`` (``--plugin``),
    apply overrides, validate."""
    raw = source_dict(name_or_path) if name_or_path is not None else {}
    return validate(apply_overrides(with_plugins(raw, plugins), overrides))


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
