"""The small models a part is checked in: one config per family, mask and position, each kept
only if config validation (the part's own ``Options.check`` included) accepts it.

Base: d_model 32, 4 heads of 8 with 2 K/V heads (GQA), 2 layers, FFN ratio 2, 288 byte tokens,
16 positions, float64. Each case changes one axis from the decoder with a causal mask and learned
positions: the masks (prefix, sliding, local_global, bigbird with blocks of 2), the positions
(none, sinusoidal, rope, alibi, t5), the encoder (bidirectional with learned, sliding with rope,
t5), the encoder-decoder and the retrieval decoder (CCA after layer 1, chunks of 5 tokens, 2
neighbours of 7 tokens each).

The retrieval case's neighbours are a fixed function of each chunk's own tokens (as a database
lookup is), so the causality check also proves the cross_attention part's shift: a part that lets
a token read the neighbours of a chunk it has not finished seeing reads tokens after it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from attnlab.config import Config, ConfigError, apply_overrides, validate
from attnlab.parts import registry

VOCAB = 288
#: sequence length of the checks (positions 0..T-1); the models hold MAX_LEN positions
T = 10
MAX_LEN = 16
PREFIX = 4
#: the retrieval case: chunk size m (divides T), neighbours k, continuation (r = m + 2)
CHUNK, NEIGHBOURS, CONTINUATION = 5, 2, 2

BASE: dict[str, Any] = {
    "model": {
        "family": "decoder",
        "vocab_size": VOCAB,
        "d_model": 32,
        "n_layers": 2,
        "max_seq_len": MAX_LEN,
        "attention": {"n_heads": 4, "n_kv_heads": 2},
        "position": {"kind": "learned"},
        "ffn": {"kind": "gelu", "ratio": 2.0},
    },
    "data": {"seq_len": MAX_LEN, "tokenizer": "bytes"},
    "train": {"device": "cpu"},
}


@dataclass(frozen=True)
class Case:
    """One small-model config: its name (``family/mask/position``) and its ``--set`` overrides."""

    family: str
    mask: str
    position: str
    overrides: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.family}/{self.mask}/{self.position}"

    @property
    def causal(self) -> bool:
        """The stack whose outputs are compared reads only earlier tokens (or a prefix)."""
        return self.family != "encoder"

    @property
    def prefix(self) -> int:
        """Positions that read each other both ways (a prefix LM's prefix), else 0."""
        return PREFIX if self.mask == "prefix" else 0


def _case(family: str, mask: str, position: str, *extra: str) -> Case:
    sets = [f"model.family={family}", f"model.attention.mask={mask}"]
    sets.append(f"model.position.kind={position}")
    if position == "rope":
        sets.append("model.position.fraction=0.5")
    if family == "encoder_decoder":
        sets.append("model.n_decoder_layers=2")
    return Case(family, mask, position, (*sets, *extra))


CASES: tuple[Case, ...] = (
    _case("decoder", "causal", "learned"),
    _case("decoder", "prefix", "learned", f"model.attention.prefix_len={PREFIX}"),
    _case("decoder", "sliding", "learned", "model.attention.window=3"),
    _case(
        "decoder",
        "local_global",
        "learned",
        "model.attention.window=3",
        "model.attention.n_global=1",
        "model.attention.global_every=4",
    ),
    _case(
        "decoder",
        "bigbird",
        "learned",
        "model.attention.window=2",
        "model.attention.n_global=1",
        "model.attention.block_size=2",
        "model.attention.random_blocks=1",
        "model.attention.random_seed=3",
    ),
    _case("decoder", "causal", "none"),
    _case("decoder", "causal", "sinusoidal"),
    _case("decoder", "causal", "rope"),
    _case("decoder", "causal", "alibi"),
    _case("decoder", "causal", "t5"),
    _case("encoder", "bidirectional", "learned"),
    _case("encoder", "sliding", "rope", "model.attention.window=3"),
    _case("encoder", "bidirectional", "t5"),
    _case("encoder_decoder", "causal", "learned"),
    _case(
        "retrieval",
        "causal",
        "learned",
        f"model.retrieval.chunk_size={CHUNK}",
        f"model.retrieval.neighbours={NEIGHBOURS}",
        f"model.retrieval.continuation={CONTINUATION}",
        "model.retrieval.cca_layers=[1]",
        f"data.seq_len={3 * CHUNK}",
    ),
)


def part_table(slot: str, kind: str, options: dict[str, Any]) -> dict[str, Any]:
    return {"kind": kind, **options}


def config_for(
    case: Case, slot: str, kind: str, options: dict[str, Any], extra: tuple[str, ...] = ()
) -> Config:
    """The validated config of ``case`` with ``slot.kind`` (and its options); ConfigError when
    the combination is refused."""
    spec = registry.get(slot, kind)
    raw = {k: dict(v) for k, v in BASE.items()}
    raw["model"] = {**BASE["model"], slot: part_table(slot, kind, options)}
    own = f"model.{slot}."  # a case's setting of the slot under check gives way to the part
    sets = [s for s in case.overrides if not s.startswith(own)]
    sets = [*sets, *spec.cls.check_config, *extra]
    return validate(apply_overrides(raw, sets))


def accepted(
    slot: str, kind: str, options: dict[str, Any]
) -> tuple[list[tuple[Case, Config]], list[tuple[str, str]]]:
    """(the cases whose config validates, [(case name, why refused)])."""
    ok, refused, names = [], [], set()
    for case in CASES:
        if slot == "position":  # the cases' own positions give way to the part under check
            case = Case(case.family, case.mask, kind, case.overrides)
            if case.name in names:
                continue
            names.add(case.name)
        try:
            ok.append((case, config_for(case, slot, kind, options)))
        except ConfigError as e:
            reason = " ".join(str(e).replace("invalid config:", "").split())
            refused.append((case.name, reason.lstrip("- ")))
    return ok, refused


@contextmanager
def float64() -> Iterator[None]:
    """float64 as the default dtype and one thread for the block (restored after): the models are
    tiny, and threads only contend for them."""
    old, threads = torch.get_default_dtype(), torch.get_num_threads()
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_default_dtype(old)
        torch.set_num_threads(threads)


def build(cfg: Config, seed: int = 0, spread: float = 0.1, dtype=torch.float64):
    """The model of ``cfg`` in ``dtype`` and eval mode, initialised from ``seed``, every weight
    then moved by N(0, ``spread``): parts that start at zero or the identity (a zeroed LN, the
    identity head's weights) take part in every comparison."""
    from attnlab.model import build_model

    torch.manual_seed(seed)
    model = build_model(cfg.model).to(dtype).eval()
    if spread:
        gen = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(
                    torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype) * spread
                )
    return model


def ids(batch: int, length: int = T, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, length), generator=gen)


def neighbours(x: torch.Tensor) -> torch.Tensor:
    """The retrieval case's neighbours of ``x`` [B, T]: [B, T // CHUNK, NEIGHBOURS, CHUNK +
    CONTINUATION] token ids, neighbour i of chunk j a fixed function of chunk j's tokens alone."""
    B, T = x.shape
    C, r = T // CHUNK, CHUNK + CONTINUATION
    chunks = x[:, : C * CHUNK].reshape(B, C, 1, CHUNK)
    s = torch.arange(r, device=x.device)
    i = torch.arange(NEIGHBOURS, device=x.device).view(1, 1, NEIGHBOURS, 1)
    return (chunks[..., s % CHUNK] * (i + 2) + s + 7 * i) % VOCAB


def inputs(case: Case, x: torch.Tensor, enc: torch.Tensor | None = None) -> dict[str, Any]:
    """The model's keyword inputs beside ``x`` in ``case``: an encoder-decoder's encoder input
    (``enc``, default ``x`` itself), the retrieval decoder's neighbours."""
    if case.family == "encoder_decoder":
        return {"encoder_input_ids": x if enc is None else enc}
    if case.family == "retrieval":
        return {"neighbours": neighbours(x)}
    return {}


def forward(model, case: Case, x: torch.Tensor, enc: torch.Tensor | None = None, **kw):
    """Logits of ``x``; an encoder-decoder reads ``enc`` (default: ``x`` itself), a retrieval
    decoder the neighbours of ``x``'s chunks."""
    return model(x, **inputs(case, x, enc), **kw).logits


def instances(model, cls: type) -> list:
    """Every module of exactly ``cls`` in ``model`` (a part per layer, cross-attention too)."""
    return [m for m in model.modules() if type(m) is cls]
