"""The typed ``[model]`` table: family, widths, structure, the attention core, and the part in
every slot of the block (each slot table validated by its part's own options class).

Its impossible combinations are refused when it loads (:mod:`attnlab.config.checks`); old keys
are translated first (:mod:`attnlab.config.legacy`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationInfo, model_validator
from pydantic_core import PydanticCustomError

from attnlab.base.schema import (
    DEFAULT_INIT_STD,
    PartOptions,
    Section,
    default_options,
    slot_field,
)
from attnlab.base.section import seed_type
from attnlab.config.carried import SLOT_FIELDS, deliver_notes, settle_carried
from attnlab.config.checks import model_problems
from attnlab.config.errors import ConfigError
from attnlab.config.legacy import legacy_position


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
    index: str = Field(
        "bm25-bigrams",
        description="the database's index, KIND or KIND:ENCODER as the retrieval database "
        "command builds it (bm25-bigrams, bm25:words, bm25:unigrams, hnsw:random, "
        "hnsw:smollm2-table, hnsw:smollm2)",
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


def _registered_family(name: str) -> str:
    """``model.family`` names a registered family (a plugin's once its file is loaded)."""
    from attnlab.parts import families

    if not families.has(name):
        raise PydanticCustomError(
            "not_registered", "{problem}", {"problem": families.unknown_message(name)}
        )
    return name


#: ``model.family``: the name of a registered family (:mod:`attnlab.parts.families`)
FamilyName = Annotated[str, AfterValidator(_registered_family)]


class ModelConfig(Section):
    """The whole network: family, widths, structure, and the part in every slot of the block.

    Each slot table names a registered part (``kind``) and holds that part's own options, e.g.
    ``[model.query] kind = "nonlinear"; ratio = 0.5``. ``attnlab parts`` lists what can go where.
    """

    family: FamilyName = Field(
        "decoder", description="a registered model family (`attnlab parts family` lists them)"
    )
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
    init_std: float = Field(DEFAULT_INIT_STD, gt=0)
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
                data = {**data, "position": legacy_position(data["position"])}
            except ConfigError as e:
                raise PydanticCustomError("same_option", "{message}", {"message": str(e)}) from None
        if isinstance(data, Mapping):
            data, notes = settle_carried(data)
            deliver_notes(notes, info.context)
        if isinstance(data, Mapping):  # the defaults the family gives (retrieval: its CCA part)
            from attnlab.parts import families

            name = data.get("family", families.DEFAULT)
            if families.has(name):
                data = families.get(name).settle(data)
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
    def position_class(self) -> Any:
        """The registered class of the position part (None: no positions); one lookup."""
        from attnlab.parts import registry

        spec = registry.get("position", self.position.kind)
        return None if spec.kind == "none" else spec.cls

    @property
    def position_limit(self) -> int | None:
        """The longest sequence the position part can place (e.g. a learned table's
        ``max_seq_len``); None: no limit, evaluation and generation may go past training. A
        built model reads it once (``Transformer.position_limit``), not per token."""
        cls = self.position_class
        return None if cls is None else cls.length_limit(self.position, self)

    @property
    def position_limit_noun(self) -> str:
        """What the position part's limit counts, for messages (e.g. "learned positions")."""
        cls = self.position_class
        return "positions" if cls is None else cls.limit_noun

    @property
    def needs_attention_matrix(self) -> bool:
        """True when a part reads the T x T probabilities, so no fused (flash) kernel is used."""
        return any(c is not None and c.needs_attention_matrix for c in self.part_classes().values())

    @model_validator(mode="after")
    def _check_combinations(self) -> ModelConfig:
        problems = model_problems(self)
        if problems:
            raise ValueError("\n".join(problems))
        return self
