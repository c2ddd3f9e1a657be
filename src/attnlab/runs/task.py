"""The loop's contract with a protocol (:mod:`attnlab.runs.loop`): the numbers it runs with
(:class:`LoopSettings`, from the shared recipe), what the protocol supplies (:class:`TrainTask`),
what a checkpoint carries besides tensors (:class:`Counters`) and how a session ended
(:class:`LoopResult`). Pretraining and the probe each implement the task; nothing else."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from attnlab.recipe import BatchPlan, TrainRecipe
from attnlab.runs import checkpoint


@dataclass(frozen=True)
class LoopSettings:
    """The numbers of the loop; :meth:`from_recipe` reads them from a :mod:`attnlab.recipe`."""

    max_steps: int
    lr: float
    min_lr: float
    warmup_steps: int
    grad_clip: float  # 0 = no clipping
    accum: int  # micro-batches per optimizer step on each rank
    tokens_per_step: int  # all ranks together
    log_every: int
    checkpoint_every: int
    eval_every: int  # 0 = never during training
    eval_at_end: bool = True
    spike_factor: float = 0.0
    grad_noise: float = 0.0  # eta: gradient noise variance at step 0 (0 = off)
    grad_noise_decay: float = 0.55  # gamma: variance eta / (1 + t)^gamma
    seed: int = 0  # the noise of step t is drawn from a generator seeded by (seed, t)

    @classmethod
    def from_recipe(
        cls, recipe: TrainRecipe, plan: BatchPlan, *, eval_at_end: bool = True
    ) -> LoopSettings:
        """The loop's numbers from a protocol's ``[train]`` recipe and its step's batch plan:
        the one mapping every protocol uses."""
        return cls(
            max_steps=recipe.max_steps,
            lr=recipe.lr,
            min_lr=recipe.min_lr,
            warmup_steps=recipe.warmup_steps,
            grad_clip=recipe.grad_clip,
            accum=plan.accum,
            tokens_per_step=plan.tokens,
            log_every=recipe.log_every,
            checkpoint_every=recipe.checkpoint_every,
            eval_every=recipe.eval_every,
            eval_at_end=eval_at_end,
            spike_factor=recipe.spike_factor,
            grad_noise=recipe.grad_noise,
            grad_noise_decay=recipe.grad_noise_decay,
            seed=recipe.seed,
        )


class TrainTask(ABC):
    """A protocol's side of the loop. Set the attributes, implement the four methods."""

    raw: nn.Module  # the unwrapped module (train/eval mode is switched on it)
    model: nn.Module  # what forward/backward runs through (DDP-wrapped, compiled, or ``raw``)
    optimizer: torch.optim.Optimizer
    params: list[torch.Tensor]  # the trainable tensors (clipped together)
    schedule_hash: str  # the stored batch schedule; a checkpoint from another one is refused
    flops_per_token: float | None = None  # forward FLOPs per token, for MFU (None: not reported)

    @abstractmethod
    def micro_loss(self, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(objective to backpropagate, loss to report) of micro-batch ``micro`` of ``step``.

        Called under the run's autocast; the loop divides the objective by ``accum``."""

    @abstractmethod
    def evaluate(self) -> float | None:
        """The validation loss now (the same fixed sequences every time), or None for none."""

    @abstractmethod
    def state_dicts(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """(model tensors to checkpoint, optimizer state dict); called on every rank."""

    @abstractmethod
    def load_state_dicts(self, ckpt: checkpoint.Checkpoint) -> None:
        """Put a checkpoint's tensors and optimizer state back (:class:`UserError` if unfit)."""


@dataclass
class Counters:
    """What a checkpoint carries besides tensors, RNG states and the monitor."""

    step: int = 0
    tokens: int = 0
    elapsed: float = 0.0  # wall seconds across sessions, evaluation and checkpoints included
    train_time: float = 0.0  # seconds spent in optimizer steps only
    best_val_loss: float | None = None
    last_val_loss: float | None = None
    last_loss: float | None = None


@dataclass
class LoopResult:
    """How :meth:`Loop.run` ended: ``status`` is the final ``status.json`` content."""

    state: str  # finished | diverged | running (stopped early)
    status: dict[str, Any]
    counters: Counters
    resumed_from: int | None = None
    reason: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
