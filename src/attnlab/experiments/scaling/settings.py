"""How a scaling curve is fitted and how far it is trusted (one typed table; every field has
the default a researcher gets without asking)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from attnlab.base.section import Section, seed_type


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
