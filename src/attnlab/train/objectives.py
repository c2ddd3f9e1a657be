"""Training objectives, as the trainer asks them of the model's family: each family declares
its :class:`~attnlab.parts.family.Objective` (the built-in ones, causal LM, masked LM (BERT) and
span corruption (T5), are ``attnlab/model/families/objectives.py``; a plugin family brings its
own), and a batch is made by the objective of that name.

Every objective turns a batch of ``n`` token windows ``x`` (and their next-token shift ``y``) into
model inputs and targets; ignored target positions are -100. The corruption of the masked and span
objectives is drawn from a NumPy generator seeded by ``(seed, step, index)``, so a resumed run, and a
run split over ranks or micro-batches, corrupts every sequence exactly as an uninterrupted run does.

Extra token ids live above the tokenizer's vocabulary ``V`` (the mask id ``V``, the span sentinels
``V + 1, V + 2, ...``); ``model.vocab_size`` must leave room for them (:func:`extra_ids`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from attnlab.base.errors import UserError
from attnlab.config import ModelConfig, TrainConfig
from attnlab.model.families.objectives import (
    MEAN_SPAN_LENGTH,
    masked_lm,
    span_corruption,
    span_counts,
)
from attnlab.parts import families

__all__ = [
    "MEAN_SPAN_LENGTH",
    "Batch",
    "Objective",
    "corruption_rng",
    "extra_ids",
    "make_batch",
    "masked_lm",
    "resolve_objective",
    "span_corruption",
    "span_counts",
]

#: an objective's name (``causal_lm``, ``masked_lm``, ``span_corruption``, a plugin family's)
Objective = str


def resolve_objective(model: ModelConfig, train: TrainConfig) -> Objective:
    """The objective of ``model.family``; ``train.objective='auto'`` picks the family's own."""
    natural = families.of(model).objective.name
    if train.objective in ("auto", natural):
        return natural
    raise UserError(
        f"train.objective={train.objective!r} does not fit model.family={model.family!r}, which "
        f"trains with {natural!r}; set train.objective='auto' (or {natural!r})"
    )


def extra_ids(objective: Objective, seq_len: int, mask_prob: float) -> int:
    """How many ids above the tokenizer vocabulary the objective uses (mask id, sentinels)."""
    return families.objective(objective).extra_ids(seq_len, mask_prob)


def corrupts(objective: Objective) -> bool:
    """Whether the objective draws from a generator (:func:`corruption_rng`)."""
    return families.objective(objective).corrupts


def corruption_rng(seed: int, step: int, index: int) -> np.random.Generator:
    """The generator for micro-batch ``index`` of ``step``; independent of process and history."""
    return np.random.default_rng([seed & 0xFFFFFFFF, step, index, 0x5EED])


@dataclass
class Batch:
    """Model inputs: ``model(input_ids, targets, **inputs)`` (``inputs``: what the family's
    forward reads beside them, e.g. ``encoder_input_ids``, ``neighbours``)."""

    input_ids: torch.Tensor
    targets: torch.Tensor
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def encoder_input_ids(self) -> torch.Tensor | None:
        return self.inputs.get("encoder_input_ids")

    @property
    def neighbours(self) -> torch.Tensor | None:
        """``model.family = "retrieval"``: the neighbours [B, C, k, r] of each chunk."""
        return self.inputs.get("neighbours")

    @neighbours.setter
    def neighbours(self, value: torch.Tensor | None) -> None:
        if value is None:
            self.inputs.pop("neighbours", None)
        else:
            self.inputs["neighbours"] = value

    @property
    def n_targets(self) -> int:
        return int((self.targets != -100).sum())

    def to(self, device: torch.device) -> Batch:
        nb = device.type == "cuda"
        return Batch(
            self.input_ids.to(device, non_blocking=nb),
            self.targets.to(device, non_blocking=nb),
            {k: v.to(device, non_blocking=nb) for k, v in self.inputs.items()},
        )


def make_batch(
    objective: Objective,
    x: np.ndarray,
    y: np.ndarray,
    rng: np.random.Generator | None,
    *,
    vocab: int,
    mask_prob: float,
    eos_id: int | None,
    model: Any = None,
) -> Batch:
    """Build the model inputs of one micro-batch for ``objective`` (``rng`` unused by an
    objective that does not corrupt; ``model``: the ``ModelConfig``, for an objective that reads
    it)."""
    made = families.objective(objective).batch(
        np.asarray(x, dtype=np.int64),
        y,
        rng,
        vocab=vocab,
        mask_prob=mask_prob,
        eos_id=eos_id,
        model=model,
    )
    tensors = {k: torch.from_numpy(np.asarray(v, dtype=np.int64)) for k, v in made.items()}
    return Batch(tensors.pop("input_ids"), tensors.pop("targets"), tensors)
