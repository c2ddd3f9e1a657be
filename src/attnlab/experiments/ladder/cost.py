"""What a ladder costs, printed before it runs: the plan per rung, the training FLOPs and the
estimated time on this machine (compare's estimator: each distinct shape timed here), and the
memory of its largest rung checked against this machine's.

    FLOPs = sum over rungs r, variants v of  seeds x 3 F_v,r D_r      (+ the tuning runs:
            len(ladder.lr) x 3 F_v,r D_r at each tuned rung, one seed)

with ``F`` attnlab's forward FLOPs per token at the training length and ``D`` the rung's tokens
(6 N D is printed beside it). The time of a tuning run is its rung's run time (the learning rate
does not change the cost).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from attnlab.experiments.ladder.plan import LadderPlan
from attnlab.experiments.running.estimate import estimate
from attnlab.experiments.running.execute import is_over
from attnlab.experiments.running.launch import effective_jobs
from attnlab.experiments.running.progress import fmt_duration
from attnlab.runs.preflight import PreflightError, check_concurrent

Say = Callable[[str], None]


@dataclass
class LadderCost:
    """Runs, FLOPs and estimated seconds of the rungs and of the tuning, and the machine load."""

    runs: int
    tuning_runs: int
    flops: float
    flops_6nd: float
    seconds: float
    load: tuple[float, float, float] | None

    def describe(self) -> str:
        load = f"; load average {self.load[0]:.1f}" if self.load else ""
        return (
            f"total: {self.runs} runs + {self.tuning_runs} tuning runs; {self.flops:.3g} training "
            f"FLOPs (3 x F x D; 6ND: {self.flops_6nd:.3g}); estimated time "
            f"{fmt_duration(self.seconds)} on this machine (measured now{load})"
        )


def check_memory(plan: LadderPlan, jobs: int) -> None:
    """Refuse a ladder whose largest rung will not fit this machine's memory (``jobs`` runs at
    once), naming the rung and the fix."""
    top = plan.rungs[-1]
    configs = [v.config for v in top.experiment.variants.values()]
    runs = len(configs) * len(plan.spec.seeds)
    try:
        check_concurrent(configs, min(jobs, runs), "attnlab ladder")
    except PreflightError as e:
        s = top.shape
        raise PreflightError(
            f"{e}\nThe ladder's largest rung ({plan.label(s.index)}: d_model={s.d_model}, "
            f"n_layers={s.n_layers}) does not fit: drop it with --set ladder.rungs="
            f"{max(1, len(plan.rungs) - 1)} (or lower ladder.widths or ladder.growth)"
            + (", or lower --jobs" if jobs > 1 else "")
        ) from None


def print_plan(plan: LadderPlan, say: Say) -> None:
    """The ladder's rule, parametrisation and one line per rung (shape, budget, N per variant)."""
    lad = plan.ladder
    say(
        f"ladder {plan.spec.name}: {len(plan.rungs)} rungs x {len(plan.variants)} variants x "
        f"{len(plan.spec.seeds)} seeds ({', '.join(map(str, plan.spec.seeds))}); "
        f"D = {lad.tokens_per_param:g} x N(baseline) tokens per rung"
    )
    grid = ", ".join(f"{x:g}" for x in lad.lr)
    if plan.mup:
        say(
            f"parametrisation: µP relative to rung 0 (d_model {plan.rungs[0].shape.d_model}); "
            + (
                f"train.lr tuned at rung 0 over [{grid}] (seed {plan.tune_seed}), then used at "
                "every rung"
                if lad.tunes
                else f"train.lr = {grid} at every rung"
            )
        )
    else:
        say(
            "parametrisation: standard; "
            + (
                f"train.lr tuned at every rung over [{grid}] (seed {plan.tune_seed})"
                if lad.tunes
                else f"train.lr = {grid} at every rung (no tuning)"
            )
        )
    for r in plan.rungs:
        s = r.shape
        sizes = ", ".join(f"{n} {v.non_embedding:,}" for n, v in r.sizes.items())
        say(
            f"  {plan.label(s.index)}: {s.n_layers} layers x {s.n_heads} heads of {s.head_dim}; "
            f"{r.steps:,} steps = {r.tokens:,} tokens; N: {sizes}"
        )


def ladder_cost(plan: LadderPlan, out, jobs: int, local: bool, tuned: set[int]) -> LadderCost:
    """Runs, FLOPs and the estimated time of what is left (``tuned``: rungs already tuned)."""
    seeds = len(plan.spec.seeds)
    grid = len(plan.ladder.lr)
    flops = flops_6nd = seconds = 0.0
    runs = tuning = 0
    load = None
    for r in plan.rungs:
        i = r.shape.index
        rung_runs = r.experiment.runs(plan.rung_dir(out, i))
        runs += len(rung_runs)
        per_run = sum(v.compute_flops for v in r.sizes.values())
        flops += seeds * per_run
        flops_6nd += seeds * sum(v.compute for v in r.sizes.values())
        j = effective_jobs(jobs, rung_runs)[0] if local else jobs
        left = [run for run in rung_runs if not is_over(run)]
        full = estimate(r.experiment, rung_runs, j)  # every shape timed once
        seconds += full.total_s * len(left) / max(1, len(rung_runs))
        load = full.load
        if i in plan.tuned_rungs():
            tuning += grid * len(r.sizes)
            flops += grid * per_run
            flops_6nd += grid * sum(v.compute for v in r.sizes.values())
            if i not in tuned:  # a tuning run costs what its rung's run costs
                seconds += full.total_s * grid / seeds
    return LadderCost(runs, tuning, flops, flops_6nd, seconds, load)
