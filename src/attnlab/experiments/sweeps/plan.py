"""The ``--plan`` text of a sweep: the grid, the run count and one line per variant."""

from __future__ import annotations

from collections.abc import Callable

from attnlab.experiments.resolve import Experiment, Variant
from attnlab.experiments.sweeps.budget import describe_count, n_runs
from attnlab.experiments.sweeps.grid import format_value


def print_sweep_plan(exp: Experiment, say: Callable[[str], None]) -> None:
    sweep = exp.sweep
    assert sweep is not None
    say(
        f"experiment {exp.name}: {describe_count(exp)} ({', '.join(map(str, exp.seeds))}) = "
        f"{n_runs(exp)} runs; {exp.steps:,} steps x {exp.tokens_per_step:,} tokens/step per run"
    )
    axes = " x ".join(
        f"{k} = {', '.join(format_value(v) for v in vals)} ({len(vals)})"
        for k, vals in sweep.grid.items()
    )
    say(f"grid: {axes}")
    if sweep.min_lr_ratio is not None:
        say(f"  train.min_lr = {sweep.min_lr_ratio:g} x train.lr at every point")
    prune = sweep.prune
    say(
        f"  pruning: on, at step {', '.join(map(str, prune.at))}: a run above {prune.factor:g} x "
        "the median val loss of its (variant, seed) grid stops"
        if prune.enabled
        else "  pruning: off"
    )
    say(
        f"  stable learning rates: no diverged seed and mean final loss within "
        f"{sweep.stable_within:g}% of the variant's best"
    )
    first: dict[str, Variant] = {}
    for v in exp.variants.values():
        first.setdefault(v.base, v)
    base_n = first[exp.baseline].params.non_embedding
    width = max(len(n) for n in first) + 2
    for name, v in first.items():
        n = v.params.non_embedding
        delta = "baseline" if name == exp.baseline else f"{100 * (n - base_n) / base_n:+.2f}%"
        keys = set(sweep.grid)
        own = [o for o in v.overrides if o.partition("=")[0] not in keys]
        line = f"  {name:<{width}}{n:>14,} non-emb. ({delta})  {' '.join(own) or '(base)'}"
        m = v.match
        if m:
            line += (
                f"  [matched to {m.target_variant}: {m.achieved:,} vs {m.target:,}, "
                f"{100 * m.rel_gap:+.3f}%]"
            )
        say(line)
    for n in exp.notes:
        say(f"  note: {n}")
