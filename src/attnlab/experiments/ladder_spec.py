"""The ``[ladder]`` table of an experiment file: the sizes, the token budget, the
parametrisation and learning-rate tuning of ``attnlab ladder``, and how its curves are fitted.

    [ladder]
    rungs = 5                    # rung i: d_model = head_dim x round(base_width x growth^i /
    base_width = 32              #   head_dim), n_layers = max(min_layers, round(d_model /
    growth = 1.414               #   aspect)), n_heads = d_model / head_dim
    head_dim = 16                # (or widths = [32, 48, 64, 96, 128] instead of the three above)
    aspect = 32.0
    min_layers = 2
    tokens_per_param = 20.0      # the budget of rung i: D = tokens_per_param x N(baseline)
    parametrisation = "mup"      # "mup": lr tuned at rung 0, used at every rung;
                                 # "standard": lr tuned at every rung
    lr = [1e-3, 3e-3, 1e-2]      # the tuning grid (one value: no tuning)
    min_lr_ratio = 0.1           # train.min_lr = ratio x the lr, at every grid point and rung
    tune_seed = 0                # the seed of the tuning runs (default: the first of seeds)

    [ladder.fit]                 # optional: attnlab.experiments.scaling.settings.FitSettings
    n_boot = 1000

The size rule is :class:`SizeRule` (:mod:`attnlab.experiments.scaling.sizes` makes rungs of
it); the fit's settings :class:`FitSettings` (:mod:`attnlab.experiments.scaling`). Both are
defined here, below the experiment file's schema that holds them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from attnlab.base.section import Section, seed_type


class SizeRule(Section):
    """How rung i is shaped and how many tokens it trains on."""

    base_width: int = Field(64, ge=1, description="d_model of rung 0")
    growth: float = Field(2**0.5, gt=1, description="d_model ratio between neighbouring rungs")
    widths: list[int] | None = Field(
        None, description="d_model of every rung, instead of base_width x growth^i"
    )
    head_dim: int = Field(16, ge=1, description="heads of this size: n_heads = d_model / head_dim")
    aspect: float = Field(32.0, gt=0, description="d_model / n_layers")
    min_layers: int = Field(2, ge=1)
    tokens_per_param: float = Field(20.0, gt=0, description="token budget D = this x N")

    @model_validator(mode="after")
    def _widths(self) -> SizeRule:
        bad = [w for w in self.widths or [] if w < self.head_dim or w % self.head_dim]
        if bad:
            raise ValueError(
                f"widths {bad} are not positive multiples of head_dim={self.head_dim}; every "
                "d_model must hold whole heads"
            )
        return self


class FitSettings(Section):
    """The fit's loss, the bootstrap, and the thresholds of the honesty checks."""

    loss: Literal["huber", "squares"] = Field(
        "huber", description="Huber loss on log L (Hoffmann et al. 2022) or least squares on log L"
    )
    delta: float | None = Field(
        None,
        gt=0,
        description="Huber threshold on log L; None = 1.345 x the seed noise (1e-3, Hoffmann's, "
        "when rungs have one seed each)",
    )
    resample: Literal["seeds", "rungs"] = Field(
        "seeds",
        description="bootstrap: seeds within rungs, or rungs (with their seeds) and then seeds",
    )
    n_boot: int = Field(1000, ge=50, description="bootstrap replicates")
    seed: seed_type("the bootstrap's random generator: the same seed, the same intervals") = 0
    level: float = Field(0.95, ge=0.5, lt=1, description="two-sided interval coverage")
    alpha_max: float = Field(2.0, gt=0, description="alpha is fitted in [0, alpha_max]")
    min_rungs: int = Field(4, ge=3, description="fewer rungs than this: no fit is trusted")
    curvature_z: float = Field(
        3.0, gt=0, description="residual curvature beyond this many standard errors: flagged"
    )
    outlier_z: float = Field(
        4.0, gt=0, description="a rung's mean this many seed-noise errors off the curve: flagged"
    )


class LadderSpec(SizeRule):
    """The ``[ladder]`` table (module docstring): a size rule, how many rungs, the
    parametrisation, the learning-rate grid and the fit."""

    rungs: int | None = Field(
        None, ge=1, description="how many rungs (None: one per entry of widths)"
    )
    parametrisation: Literal["mup", "standard"] = Field(
        "mup",
        description="mup: the lr tuned at rung 0 is used at every rung (model.parametrisation = "
        "'mup' relative to rung 0's width); standard: the lr is tuned at every rung",
    )
    lr: list[float] = Field(
        default_factory=lambda: [1e-3, 3e-3, 1e-2],
        min_length=1,
        description="train.lr grid of the tuning runs, best final validation loss per variant",
    )
    min_lr_ratio: float = Field(0.1, gt=0, le=1, description="train.min_lr = this x train.lr")
    tune_seed: seed_type("the seed of the tuning runs") | None = None  # type: ignore[valid-type]
    fit: FitSettings = FitSettings()

    @model_validator(mode="after")
    def _count(self) -> LadderSpec:
        if self.widths is None and self.rungs is None:
            raise ValueError("[ladder] needs rungs = N (or widths = [...], one per rung)")
        if self.widths is not None and self.rungs not in (None, len(self.widths)):
            raise ValueError(
                f"ladder.rungs = {self.rungs} but ladder.widths has {len(self.widths)} entries; "
                "give one of them"
            )
        if any(lr <= 0 for lr in self.lr):
            raise ValueError(f"ladder.lr = {self.lr}: learning rates must be positive")
        if len(set(self.lr)) != len(self.lr):
            raise ValueError(f"ladder.lr = {self.lr} repeats a value")
        return self

    @property
    def count(self) -> int:
        """The number of rungs."""
        return len(self.widths) if self.widths is not None else int(self.rungs or 0)

    @property
    def tunes(self) -> bool:
        """True when there is a grid to tune over (more than one lr)."""
        return len(self.lr) > 1
