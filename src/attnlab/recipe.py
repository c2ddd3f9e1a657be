"""One training recipe for every protocol: the ``[train]`` keys that pretraining (``attnlab train``,
``compare``, sweeps) and the frozen probe share, each with one meaning.

    max_steps          optimizer steps
    seed               seed of the batch schedule (and of the initialisation and dropout)
    batch_size         sequences per micro-batch: one forward/backward on one process
    tokens_per_step    tokens per optimizer step, all processes together (None: one micro-batch
                       per process); accumulation A = tokens_per_step / (batch_size x seq_len x W)
    lr, min_lr, warmup_steps       linear warmup to lr, then cosine down to min_lr at max_steps
    weight_decay, beta1, beta2     AdamW, decay on >= 2-D weights only
    grad_clip          global gradient-norm clip (0 = none)
    grad_noise, grad_noise_decay   annealed Gaussian gradient noise (Neelakantan et al. 2015):
                       after clipping, g += N(0, eta / (1 + t)^gamma) at step t (eta 0 = off)
    dtype, device, deterministic, threads       precision, where and how the steps run
    log_every, eval_every, checkpoint_every     metrics rows, validation loss, checkpoints
    spike_factor       divergence: loss > factor x best smoothed loss (0 = off; NaN/inf always)
    loggers            where metrics go besides metrics.jsonl

A protocol subclasses :class:`TrainRecipe` and adds what is its own (pretraining: the objective,
``parallel``, ``compile``, ``eval_batches``, ``init_from``; the probe: ``seq_len``,
``gradient_checkpointing``). It may give a shared key another default (the probe's paper recipe:
500 steps, batch 16, lr 1e-5, beta2 0.999, ...) by declaring it again with the same type alias
below, which carries the key's bounds and description: defaults may differ, meanings may not.
Only where 0 means something to a protocol may it widen a bound (the probe's ``max_steps = 0``:
train nothing; ``eval_every = 0``: no validation loss during training).
:meth:`TrainRecipe.batch_plan` cuts a step into micro-batches for every protocol, and
:meth:`attnlab.runs.loop.LoopSettings.from_recipe` hands the recipe to the one training loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field, model_validator

from attnlab.base.errors import UserError
from attnlab.base.section import Section, seed_type

#: experiment trackers (attnlab.runs.trackers); jsonl is always on
Logger = Literal["jsonl", "tensorboard", "wandb"]

# One alias per shared key: its type, bounds and meaning. A protocol that changes a default
# declares the key again with the alias (``lr: LearningRate = 1e-5``).
MaxSteps = Annotated[int, Field(ge=1, description="optimizer steps")]
Seed = seed_type("seed of the batch schedule, init and dropout (0 .. 2**32 - 1)")
MicroBatch = Annotated[
    int, Field(ge=1, description="sequences per micro-batch (one forward/backward) per process")
]
TokensPerStep = Annotated[
    int | None,
    Field(
        ge=1,
        description="tokens per optimizer step, all processes together: micro-batches are "
        "accumulated up to it; None = one micro-batch per process",
    ),
]
LearningRate = Annotated[float, Field(gt=0, description="peak learning rate (after warmup)")]
MinLearningRate = Annotated[float, Field(ge=0, description="cosine floor, reached at max_steps")]
WarmupSteps = Annotated[int, Field(ge=0, description="linear warmup steps")]
WeightDecay = Annotated[float, Field(ge=0, description="AdamW decay on >= 2-D weights")]
Beta = Annotated[float, Field(ge=0, lt=1)]
GradClip = Annotated[float, Field(ge=0, description="global gradient-norm clip; 0 = none")]
Dtype = Annotated[
    Literal["auto", "float32", "bfloat16", "float16"],
    Field(description="autocast dtype; auto = bfloat16 on CUDA, float32 elsewhere"),
]
EvalEvery = Annotated[int, Field(ge=1, description="validation loss every n steps")]


@dataclass(frozen=True)
class BatchPlan:
    """How one optimizer step is cut: ``micro`` sequences per forward/backward, ``accum`` of them
    on each of ``world`` processes, every sequence ``seq_len`` tokens."""

    micro: int
    accum: int
    world: int
    seq_len: int

    @property
    def sequences(self) -> int:
        """Sequences per optimizer step, all processes together (a row of the batch schedule)."""
        return self.micro * self.accum * self.world

    @property
    def tokens(self) -> int:
        """Tokens per optimizer step, all processes together."""
        return self.sequences * self.seq_len


def grad_accum_steps(tokens_per_step: int | None, batch_size: int, seq_len: int, world: int) -> int:
    """``A = tokens_per_step / (B * T * W)``, which must be a positive integer (None: 1)."""
    per_micro = batch_size * seq_len * world
    if tokens_per_step is None:
        return 1
    if tokens_per_step % per_micro == 0:
        return tokens_per_step // per_micro
    lo = max(1, tokens_per_step // per_micro)
    options = sorted({lo * per_micro, (lo + 1) * per_micro})
    raise UserError(
        f"train.tokens_per_step={tokens_per_step} is not a multiple of batch_size * seq_len * "
        f"world_size = {batch_size} * {seq_len} * {world} = {per_micro}; use "
        + " or ".join(str(o) for o in options)
        + " (or change train.batch_size)"
    )


class TrainRecipe(Section):
    """The shared ``[train]`` keys (see the module docstring); the defaults are the from-scratch
    recipe of SPEC 2.1 (AdamW (0.9, 0.95), warmup + cosine, clip 1.0)."""

    max_steps: MaxSteps = 1000
    seed: Seed = 0
    batch_size: MicroBatch = 8
    tokens_per_step: TokensPerStep = None
    lr: LearningRate = 6e-4
    min_lr: MinLearningRate = 6e-5
    warmup_steps: WarmupSteps = 100
    weight_decay: WeightDecay = 0.1
    beta1: Beta = 0.9
    beta2: Beta = 0.95
    grad_clip: GradClip = 1.0
    grad_noise: float = Field(
        0.0, ge=0, description="gradient noise variance eta at step 0 (0 = off; the paper: 0.01-1)"
    )
    grad_noise_decay: float = Field(
        0.55, ge=0, description="gradient noise: the variance decays as eta / (1 + t)^gamma"
    )
    eval_every: EvalEvery = 100
    checkpoint_every: int = Field(100, ge=1, description="a checkpoint every n steps")
    log_every: int = Field(10, ge=1, description="a metrics.jsonl row every n steps")
    dtype: Dtype = "auto"
    device: str = Field("auto", description="auto (CUDA, else MPS, else CPU), cpu, cuda:N, mps")
    deterministic: bool = Field(
        False, description="bit-identical reruns on a GPU too (attnlab.runs.determinism; slower)"
    )
    threads: int | None = Field(None, ge=1, description="torch CPU threads; None = torch's")
    spike_factor: float = Field(0.0, ge=0, description="diverged if loss > factor * best (0 = off)")
    loggers: list[Logger] = Field(
        default_factory=lambda: ["jsonl"],
        description="where metrics go: jsonl (metrics.jsonl, always written), tensorboard, wandb",
    )

    @property
    def betas(self) -> tuple[float, float]:
        return (self.beta1, self.beta2)

    def batch_plan(self, seq_len: int, world: int = 1) -> BatchPlan:
        """The micro-batches of one step with sequences of ``seq_len`` tokens on ``world``
        processes; a ``tokens_per_step`` that is not a whole number of them is a UserError."""
        accum = grad_accum_steps(self.tokens_per_step, self.batch_size, seq_len, world)
        return BatchPlan(self.batch_size, accum, world, seq_len)

    @model_validator(mode="after")
    def _check_schedule(self) -> TrainRecipe:
        if self.min_lr > self.lr:
            raise ValueError(f"train.min_lr={self.min_lr} exceeds train.lr={self.lr}")
        if self.max_steps and self.warmup_steps > self.max_steps:
            raise ValueError(
                f"train.warmup_steps={self.warmup_steps} exceeds train.max_steps={self.max_steps}"
            )
        return self
