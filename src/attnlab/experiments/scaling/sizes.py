"""The sizes of a ladder: rung i's shape, its token budget and its compute; each rung resolved as
an experiment, so a parameter-matched control is matched again at every size.

Shape of rung i (:class:`SizeRule`): width grows geometrically and depth with it, heads of a
fixed size (so the attention scale and the head's own shape stay put as the model grows):

    d_model(i) = head_dim x round(base_width x growth^i / head_dim)   (or widths[i] when given)
    n_heads(i) = d_model(i) / head_dim
    n_layers(i) = max(min_layers, round(d_model(i) / aspect))

Size and budget: ``N`` is the non-embedding parameter count (Kaplan et al. 2020; what
:func:`attnlab.model.params.count` calls ``non_embedding``), counted on the meta device. The
token budget is proportional to the baseline's N, ``D = tokens_per_param x N`` (Hoffmann et al.
2022 find about 20 compute-optimal), rounded up to whole optimizer steps and the same for every
variant of the rung (fair: identical batches per seed, as in ``compare``). Compute two ways:
``C = 6 N D`` (the Kaplan approximation) and ``C_flops = 3 x F x D`` with ``F`` the forward FLOPs
per token of attnlab's FLOP counter at the training length (attention's ``T`` term included).

A variant's own widths given as absolute sizes (``model.ffn.hidden = 1024``) do not grow with the
rung; give them as ratios (``model.ffn.ratio``) or let ``match_params`` size them per rung.
Cost: two resolutions per rung (the first reads the rung's base config), each a few builds on the
meta device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from attnlab.config import Config, ConfigError, load_config
from attnlab.experiments.ladder_spec import SizeRule
from attnlab.experiments.resolve import Experiment, resolve
from attnlab.experiments.spec import Budget, ExperimentSpec
from attnlab.model.params import count

#: the sizes the seed papers ask about, as (preset, overrides): GPT-2 small and Pythia-1B
PAPER_SIZES: dict[str, tuple[str, tuple[str, ...]]] = {
    "124M": ("gpt2-124m", ()),
    "1B": (
        "pythia-410m",
        ("model.d_model=2048", "model.n_layers=16", "model.attention.n_heads=8"),
    ),
}
#: a resolution's placeholder budget while the rung's own is not known yet
_PLACEHOLDER_STEPS = 2**31


@dataclass(frozen=True)
class RungShape:
    """Rung ``index``'s shape and the ``--set`` overrides that give it to a config."""

    index: int
    d_model: int
    n_layers: int
    n_heads: int
    head_dim: int

    @property
    def overrides(self) -> list[str]:
        return [
            f"model.d_model={self.d_model}",
            f"model.n_layers={self.n_layers}",
            f"model.attention.n_heads={self.n_heads}",
            f"model.attention.head_dim={self.head_dim}",
        ]


def shape(rule: SizeRule, index: int) -> RungShape:
    """Rung ``index``'s width, depth and heads (:class:`SizeRule`)."""
    if index < 0 or (rule.widths is not None and index >= len(rule.widths)):
        top = f"0..{len(rule.widths) - 1}" if rule.widths else "0 or more"
        raise ConfigError(f"rung index {index} is out of range ({top})")
    if rule.widths is not None:
        d = rule.widths[index]
    else:
        d = rule.head_dim * max(1, round(rule.base_width * rule.growth**index / rule.head_dim))
    layers = max(rule.min_layers, round(d / rule.aspect))
    return RungShape(index, d, layers, d // rule.head_dim, rule.head_dim)


@dataclass(frozen=True)
class VariantSize:
    """One variant at one rung: N, and compute for the rung's D tokens."""

    non_embedding: int
    flops_per_token: int
    compute: float
    compute_flops: float


@dataclass
class Rung:
    """A resolved rung: its shape, budget, each variant's size, and the experiment to run."""

    shape: RungShape
    steps: int
    tokens: int
    experiment: Experiment
    sizes: dict[str, VariantSize] = field(default_factory=dict)


def train_flops_per_token(cfg: Config) -> int:
    """Forward FLOPs per token at the training length ``data.seq_len`` (attnlab's counter)."""
    from attnlab.model.transformer import build_model

    with torch.device("meta"):
        model = build_model(cfg.model)
    return model.flops_per_token(cfg.data.seq_len)


def variant_size(cfg: Config, n: int, tokens: int) -> VariantSize:
    """C = 6 N D and C_flops = 3 F D for a variant of ``n`` non-embedding parameters."""
    f = train_flops_per_token(cfg)
    return VariantSize(n, f, 6.0 * n * tokens, 3.0 * f * tokens)


def rung_experiment(
    spec: ExperimentSpec,
    rule: SizeRule,
    index: int,
    *,
    folder: str | Path = ".",
    base_overrides: list[str] | None = None,
) -> Rung:
    """The experiment ``spec`` at rung ``index``: the rung's shape set on the base (after
    ``base_overrides``), the budget ``tokens_per_param x N(baseline)`` in whole steps, every
    variant resolved (``match_params`` controls matched at this size) and counted."""
    rs = shape(rule, index)
    overrides = [*(base_overrides or []), *rs.overrides]
    probe = spec.model_copy(update={"budget": Budget(steps=_PLACEHOLDER_STEPS)})
    first = resolve(probe, folder=folder, base_overrides=overrides)
    n_base = first.variants[first.baseline].params.non_embedding
    per_step = first.tokens_per_step
    steps = max(1, math.ceil(rule.tokens_per_param * n_base / per_step))
    exp = resolve(
        spec.model_copy(update={"budget": Budget(steps=steps)}),
        folder=folder,
        base_overrides=overrides,
    )
    tokens = steps * per_step
    sizes = {
        name: variant_size(v.config, v.params.non_embedding, tokens)
        for name, v in exp.variants.items()
    }
    return Rung(rs, steps, tokens, exp, sizes)


def paper_sizes() -> dict[str, int]:
    """Non-embedding N of the papers' models, counted: "124M" (GPT-2 small, 85.0M) and "1B"
    (Pythia-1B's shape, 805.7M), the sizes a ladder's gap is extrapolated to."""
    return {
        label: count(load_config(preset, list(sets)).model).non_embedding
        for label, (preset, sets) in PAPER_SIZES.items()
    }
