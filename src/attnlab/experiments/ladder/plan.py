"""A ladder planned before anything trains: every rung resolved as an experiment (shape, budget,
matched controls), the learning-rate tuning it needs, where each part lives under ``OUT``, and
what it costs.

    OUT/ladder.json            the plan and the learning rates chosen (:mod:`.run` writes it)
    OUT/tune/r<i>-d<d>/        rung i's tuning sweep (a compare directory with a [sweep] over
                               train.lr, one seed): rung 0 under µP, every rung without it
    OUT/rungs/r<i>-d<d>/       rung i as a compare directory: runs/<variant>/seed<k>/

Under µP (``ladder.parametrisation = "mup"``) every rung's config gets
``model.parametrisation = "mup"`` with ``model.mup_base_width`` = rung 0's width, so rung 0 is
the standard model and the learning rate tuned there is the one µP transfers. Cost of planning:
two resolutions per rung (:func:`~attnlab.experiments.scaling.sizes.rung_experiment`), a few
meta-device builds each.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlab.experiments.ladder_spec import LadderSpec
from attnlab.experiments.resolve import Experiment
from attnlab.experiments.scaling.sizes import Rung, rung_experiment, shape
from attnlab.experiments.spec import Budget, ExperimentSpec
from attnlab.experiments.sweep_spec import SweepSpec
from attnlab.experiments.sweeps.grid import expand


@dataclass
class LadderPlan:
    """The experiment file's spec and ``[ladder]``, the base ``--set`` items (µP's included) and
    every rung resolved at the base config's learning rate (the cost does not depend on it)."""

    spec: ExperimentSpec
    ladder: LadderSpec
    folder: Path
    base_overrides: list[str]
    rungs: list[Rung]
    source: str = ""

    @property
    def mup(self) -> bool:
        return self.ladder.parametrisation == "mup"

    @property
    def variants(self) -> list[str]:
        return [v.name for v in self.spec.variants]

    @property
    def baseline(self) -> str:
        return self.spec.baseline_name

    @property
    def tune_seed(self) -> int:
        return self.ladder.tune_seed if self.ladder.tune_seed is not None else self.spec.seeds[0]

    def tuned_rungs(self) -> list[int]:
        """The rungs whose learning rate is tuned: rung 0 under µP, every rung without it, none
        for a grid of one value."""
        if not self.ladder.tunes:
            return []
        return [0] if self.mup else list(range(len(self.rungs)))

    def lr_source(self, index: int) -> int | None:
        """The rung whose tuned learning rate rung ``index`` uses (None: the one grid value)."""
        tuned = self.tuned_rungs()
        if not tuned:
            return None
        return index if index in tuned else tuned[0]

    def label(self, index: int) -> str:
        return f"r{index}-d{shape(self.ladder, index).d_model}"

    def rung_dir(self, out: Path, index: int) -> Path:
        return Path(out) / "rungs" / self.label(index)

    def tune_dir(self, out: Path, index: int) -> Path:
        return Path(out) / "tune" / self.label(index)

    def _overrides(self, index: int) -> list[str]:
        return [*self.base_overrides, *self.rungs[index].shape.overrides]

    def tuning(self, index: int) -> Experiment:
        """Rung ``index``'s tuning sweep: every variant at every ``ladder.lr`` (with
        ``min_lr = min_lr_ratio x lr``), one seed, the rung's budget (sweep machinery)."""
        rung = self.rungs[index]
        sweep = SweepSpec(
            grid={"train.lr": list(self.ladder.lr)}, min_lr_ratio=self.ladder.min_lr_ratio
        )
        spec = self.spec.model_copy(
            update={
                "name": f"{self.spec.name}-tune-{self.label(index)}",
                "sweep": sweep,
                "ladder": None,
                "seeds": [self.tune_seed],
                "budget": Budget(steps=rung.steps),
            }
        )
        return expand(
            spec, folder=self.folder, base_overrides=self._overrides(index), source=self.source
        )

    def with_lrs(self, index: int, lrs: dict[str, float]) -> Rung:
        """Rung ``index`` resolved with each variant's learning rate (``lrs`` by variant)."""
        ratio = self.ladder.min_lr_ratio
        variants = [
            v.model_copy(update={"set": [*v.set, *lr_items(lrs[v.name], ratio)]})
            for v in self.spec.variants
        ]
        return _rung(self, index, self.spec.model_copy(update={"variants": variants}))

    def record(self) -> dict[str, Any]:
        """The plan as ``ladder.json`` stores it (the learning rates are added by the run)."""
        return {
            "name": self.spec.name,
            "description": self.spec.description,
            "source": self.source,
            "baseline": self.baseline,
            "variants": self.variants,
            "seeds": list(self.spec.seeds),
            "parametrisation": self.ladder.parametrisation,
            "lr_grid": list(self.ladder.lr),
            "min_lr_ratio": self.ladder.min_lr_ratio,
            "tune_seed": self.tune_seed,
            "tuned_rungs": self.tuned_rungs(),
            "rule": self.ladder.model_dump(exclude={"fit", "lr", "min_lr_ratio", "tune_seed"}),
            "fit": self.ladder.fit.model_dump(),
            "rungs": [
                {
                    "index": r.shape.index,
                    "label": self.label(r.shape.index),
                    "d_model": r.shape.d_model,
                    "n_layers": r.shape.n_layers,
                    "n_heads": r.shape.n_heads,
                    "head_dim": r.shape.head_dim,
                    "steps": r.steps,
                    "tokens": r.tokens,
                    "sizes": {
                        name: {
                            "N": s.non_embedding,
                            "flops_per_token": s.flops_per_token,
                            "C": s.compute,
                            "C_flops": s.compute_flops,
                        }
                        for name, s in r.sizes.items()
                    },
                }
                for r in self.rungs
            ],
        }


def lr_items(lr: float, ratio: float) -> list[str]:
    """The ``--set`` items of one learning rate: ``train.lr`` and ``train.min_lr``."""
    return [f"train.lr={lr!r}", f"train.min_lr={ratio * lr!r}"]


def _rung(plan: LadderPlan, index: int, spec: ExperimentSpec) -> Rung:
    rung = rung_experiment(
        spec.model_copy(update={"ladder": None, "budget": Budget(steps=1)}),
        plan.ladder,
        index,
        folder=plan.folder,
        base_overrides=plan.base_overrides,
    )
    rung.experiment.source = plan.source
    rung.experiment.name = f"{spec.name}-{plan.label(index)}"
    return rung


def plan_ladder(
    spec: ExperimentSpec,
    *,
    folder: str | Path = ".",
    base_overrides: list[str] = (),
    source: str = "",
) -> LadderPlan:
    """Every rung of ``spec``'s ``[ladder]`` resolved (µP's overrides added under µP)."""
    ladder = spec.ladder
    assert ladder is not None
    overrides = list(base_overrides)
    if ladder.parametrisation == "mup":
        base_width = shape(ladder, 0).d_model
        overrides += ["model.parametrisation=mup", f"model.mup_base_width={base_width}"]
    lrs = {v.name: ladder.lr[0] for v in spec.variants}
    plan = LadderPlan(spec, ladder, Path(folder), overrides, [], source)
    first_lr = [
        v.model_copy(update={"set": [*v.set, *lr_items(lrs[v.name], ladder.min_lr_ratio)]})
        for v in spec.variants
    ]
    lr_spec = spec.model_copy(update={"variants": first_lr})
    for i in range(ladder.count):
        plan.rungs.append(_rung(plan, i, lr_spec))
    return plan
