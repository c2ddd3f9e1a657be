"""The ``--plan`` text of ``attnlab compare``: one line per variant (parameters, change vs the
baseline, overrides, match); a sweep adds its grid and run count."""

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
        say(_variant_line(v, name, width, delta, own))
    for n in exp.notes:
        say(f"  note: {n}")


def print_plan(exp: Experiment, say: Callable[[str], None]) -> None:
    """One line per variant: non-embedding parameters, change vs the baseline, overrides, match;
    a sweep adds its grid and run count (:func:`print_sweep_plan`)."""
    if exp.sweep is not None:
        print_sweep_plan(exp, say)
        return
    base_n = exp.variants[exp.baseline].params.non_embedding
    say(
        f"experiment {exp.name}: {len(exp.variants)} variants x {len(exp.seeds)} "
        f"seed{'s' if len(exp.seeds) > 1 else ''} "
        f"({', '.join(map(str, exp.seeds))}); {exp.steps:,} steps x {exp.tokens_per_step:,} "
        "tokens/step per run"
    )
    width = max(len(n) for n in exp.variants) + 2
    for v in exp.variants.values():
        n = v.params.non_embedding
        delta = "baseline" if v.name == exp.baseline else f"{100 * (n - base_n) / base_n:+.2f}%"
        say(_variant_line(v, v.name, width, delta, v.overrides))
    for n in exp.notes:
        say(f"  note: {n}")


def _variant_line(v: Variant, name: str, width: int, delta: str, overrides: list[str]) -> str:
    n = v.params.non_embedding
    line = f"  {name:<{width}}{n:>14,} non-emb. ({delta})  {' '.join(overrides) or '(base)'}"
    m = v.match
    if m:
        line += (
            f"  [matched to {m.target_variant}: {m.achieved:,} vs {m.target:,}, "
            f"{100 * m.rel_gap:+.3f}%]"
        )
    return line
