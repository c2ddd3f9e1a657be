"""The small models a part is checked in: the cases every registered family declares
(:attr:`~attnlab.parts.family.Family.check_cases`: a mask, a position and overrides), each kept
only if config validation (the part's own ``Options.check`` included) accepts it.

Base: d_model 32, 4 heads of 8 with 2 K/V heads (GQA), 2 layers, FFN ratio 2, 288 byte tokens,
16 positions, float64. The built-in families declare: the decoder with a causal mask and learned
positions, then each other mask (prefix, sliding, local_global, bigbird with blocks of 2) and
each other position (none, sinusoidal, rope, alibi, t5); the encoder (bidirectional with learned,
sliding with rope, t5); the encoder-decoder; the retrieval decoder (CCA after layer 1, chunks of
5 tokens, 2 neighbours of 7 tokens each, neighbours a fixed function of each chunk's own tokens
so the causality check also proves the cross_attention part's shift). A plugin family's cases
join them once it is loaded. The first case (the default family's first) is the battery's base,
the model its unfused and export checks build.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from attnlab.config import Config, ConfigError, apply_overrides, validate
from attnlab.parts import families, registry

VOCAB = 288
#: sequence length of the checks (positions 0..T-1); the models hold MAX_LEN positions
T = 10
MAX_LEN = 16

BASE: dict[str, Any] = {
    "model": {
        "family": families.DEFAULT,
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
        return families.get(self.family).causal_lm

    @property
    def prefix(self) -> int:
        """Positions that read each other both ways (a prefix LM's prefix), else 0."""
        if self.mask != "prefix":
            return 0
        found = [re.fullmatch(r"model\.attention\.prefix_len=(\d+)", s) for s in self.overrides]
        return next(int(m.group(1)) for m in found if m)


def _case(family: str, mask: str, position: str, *extra: str) -> Case:
    sets = [f"model.family={family}", f"model.attention.mask={mask}"]
    sets.append(f"model.position.kind={position}")
    if position == "rope":
        sets.append("model.position.fraction=0.5")
    return Case(family, mask, position, (*sets, *extra))


def all_cases() -> tuple[Case, ...]:
    """The cases of every registered family, the default family's first (the base case)."""
    default = families.spec(families.DEFAULT)
    ordered = [default, *(s for s in families.specs() if s is not default)]
    return tuple(
        _case(s.name, c.mask, c.position, *c.overrides)
        for s in ordered
        for c in s.family.check_cases
    )


#: the built-in families' cases (:func:`all_cases` adds those of plugin families loaded since)
CASES: tuple[Case, ...] = all_cases()


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
    for case in all_cases():
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


def inputs(
    case: Case, x: torch.Tensor, enc: torch.Tensor | None = None, cfg: Any = None
) -> dict[str, Any]:
    """The model's keyword inputs beside ``x`` in ``case``, as its family declares them
    (``check_inputs``: an encoder-decoder's encoder input ``enc``, default ``x`` itself; the
    retrieval decoder's neighbours of ``x``'s chunks); ``cfg`` is the model's ``ModelConfig``."""
    return families.get(case.family).check_inputs(x, enc, cfg)


def forward(model, case: Case, x: torch.Tensor, enc: torch.Tensor | None = None, **kw):
    """Logits of ``x`` with the inputs of ``case``'s family beside it (:func:`inputs`)."""
    return model(x, **inputs(case, x, enc, model.cfg), **kw).logits


def instances(model, cls: type) -> list:
    """Every module of exactly ``cls`` in ``model`` (a part per layer, cross-attention too)."""
    return [m for m in model.modules() if type(m) is cls]
