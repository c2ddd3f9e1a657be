"""``OUT/report.md`` of a sweep (an experiment with a ``[sweep]`` grid), with ``OUT/plots/`` and
``OUT/sweep.csv``: per-variant tables over the grid, final loss vs learning rate, the best point
per variant with its seed spread, best vs best with a paired test, and the stable learning-rate
range per variant (definitions in :mod:`~attnlab.experiments.reports.sweep_analysis`). Rebuilt from
the run directories and ``experiment.json`` alone, like the comparison report; one function per
section, in the order the report shows them (:func:`sweep_report`).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnlab.experiments.reports import sweep_plots
from attnlab.experiments.reports.curves import Band, band
from attnlab.experiments.reports.markdown import (
    PLOTS,
    count_statuses,
    fmt,
    image,
    pm,
    signed_pct,
    status_counts,
    table,
    write_report,
)
from attnlab.experiments.reports.sections import fairness_section, notes_section, written_by
from attnlab.experiments.reports.sweep_analysis import (
    Cell,
    StableRange,
    best_cell,
    best_vs_best,
    cells,
    facets,
    in_facet,
    lr_key,
    stable_ranges,
)
from attnlab.experiments.results import RunRow, val_curve
from attnlab.experiments.sweeps.grid import format_value, short_names

Record = dict[str, Any]

FAIRNESS_RULE = (
    "Every run of a seed, at every grid point, must read the same training batches; the grid "
    "may not change the data, sequence length, batch or budget."
)


def sweep_report(out: Path, record: Record, rows: list[RunRow]) -> Path:
    """Write report.md, plots and sweep.csv for a sweep; returns the report's path."""
    cs = cells(rows, record)
    write_sweep_csv(out, rows, record)
    return write_report(
        out,
        [
            *header_section(record, rows, cs),
            *grid_section(out, record, cs),
            *best_section(record, cs),
            *best_vs_best_section(record, cs),
            *stable_section(record, cs),
            *curves_section(out, record, cs),
            *fairness_section(rows, record["seeds"], FAIRNESS_RULE),
            *runs_section(rows),
            *notes_section(rows, list(record.get("notes", [])), ("failed", "running", "missing")),
        ],
    )


# ------------------------------------------------------------------------------------ sections


def header_section(record: Record, rows: list[RunRow], cs: list[Cell]) -> list[str]:
    """The title, the description and one bullet per fact of the sweep."""
    sweep, base, tps = record["sweep"], record["baseline"], record["tokens_per_step"]
    variants, prune = sweep["variants"], sweep["prune"]
    cfg0 = record["variants"][0]["config"]
    d, spike = cfg0["data"], cfg0["train"]["spike_factor"]
    counts = count_statuses(r.status for r in rows)
    axes = " x ".join(
        f"`{k}` in {{{', '.join(format_value(v) for v in vals)}}}"
        for k, vals in sweep["grid"].items()
    )
    n_points = len(cs) // max(len(variants), 1)
    lines = [f"# Sweep `{record['name']}`", ""]
    if record.get("description"):
        lines += [record["description"].strip(), ""]
    lines += [
        f"- experiment file: `{record.get('source') or '?'}`; baseline: **{base}**; seeds: "
        f"{', '.join(map(str, record['seeds']))} (runs are paired by seed: every run of a seed "
        "reads the same batches)",
        f"- grid: {axes} = {n_points} points; {len(variants)} variants x {n_points} points x "
        f"{len(record['seeds'])} seeds = {len(rows)} runs ({status_counts(counts)})",
    ]
    if sweep.get("min_lr_ratio") is not None:
        lines.append(f"- `train.min_lr` = {sweep['min_lr_ratio']:g} x `train.lr` at every point")
    lines += [
        f"- budget: {record['steps']:,} steps x {tps:,} tokens/step = "
        f"{record['steps'] * tps:,} tokens per run; data: `{d['corpus']}`, tokenizer "
        f"`{d['tokenizer']}`, sequence length {d['seq_len']}",
        "- divergence: NaN/inf loss or gradient"
        + (
            f", or a loss above train.spike_factor = {spike:g} x the best smoothed loss"
            if spike
            else ""
        )
        + "; a diverged run stops there and is shown as diverged, never dropped",
        _pruning_bullet(prune, counts),
        written_by(),
        "",
    ]
    return lines


def _pruning_bullet(prune: dict[str, Any], counts: dict[str, int]) -> str:
    if not prune["enabled"]:
        return "- early stopping (pruning): off; every run trained to the end or until it diverged"
    return (
        f"- early stopping (pruning): **on**, at step {', '.join(map(str, prune['at']))}: a run "
        f"whose validation loss was above {prune['factor']:g} x the median of its "
        f"(variant, seed) grid stopped there and is marked `pruned` "
        f"({counts.get('pruned', 0)} runs); a pruned point is neither stable nor a best point"
    )


def grid_section(out: Path, record: Record, cs: list[Cell]) -> list[str]:
    """The final loss of every (variant, point) in tables over the learning rate, and its plot."""
    sweep, base = record["sweep"], record["baseline"]
    grid, variants = sweep["grid"], sweep["variants"]
    p = sweep_plots.loss_vs_lr(cs, grid, variants, base, out / PLOTS / "sweep_loss_vs_lr.png")
    return [
        "## Final validation loss over the grid",
        "",
        "Mean ± sample std over the seeds that finished; **bold**: the variant's best point "
        "(the lowest mean among the points where every seed finished). Diverged and pruned runs "
        "are counted in the cell.",
        "",
        *_grid_tables(cs, grid, variants, base),
        *image("final loss vs learning rate", p, out),
    ]


def best_section(record: Record, cs: list[Cell]) -> list[str]:
    """Each variant's best point, its loss, its seed spread and its distance to the baseline's."""
    base, variants = record["baseline"], record["sweep"]["variants"]
    base_best = best_cell(cs, base)
    rows = []
    for v in variants:
        b = best_cell(cs, v)
        if b is None:
            rows.append([v, "none (no point where every seed finished)", "—", "—", "—"])
            continue
        losses = list(b.losses().values())
        rows.append(
            [
                _label(v, base),
                _point(b.point),
                pm(b.mean, b.std),
                f"{min(losses):.4f} – {max(losses):.4f} ({len(losses)} seeds)",
                "—" if v == base or base_best is None else f"{b.mean - base_best.mean:+.4f}",
            ]
        )
    heads = ["variant", "best point", "final val loss", "seed spread (min – max)", "Δ vs baseline"]
    return ["## Best point per variant", "", table(heads, rows, "llrrr"), ""]


def best_vs_best_section(record: Record, cs: list[Cell]) -> list[str]:
    """Each variant at its best point against the baseline at its own, with the paired tests."""
    bvb = best_vs_best(cs, record["sweep"]["variants"], record["baseline"])
    if not bvb:
        return []
    rows = [
        [
            x.variant,
            _point(x.best.point),
            pm(x.best.mean, x.best.std),
            _point(x.baseline.point),
            pm(x.baseline.mean, x.baseline.std),
            signed_pct(x.rel_improvement),
            x.test.describe_t(),
            x.test.describe_sign_flip(),
            str(x.test.n),
        ]
        for x in bvb
    ]
    heads = [
        "variant",
        "its best point",
        "loss",
        "baseline's best point",
        "baseline loss",
        "rel. improvement",
        "p (paired t)",
        "p (sign-flip)",
        "seeds",
    ]
    return [
        "## Best vs best",
        "",
        "Each variant at its own best point against the baseline at its own best point: the "
        "fair comparison when the variants prefer different learning rates. Relative "
        "improvement = 100 · (baseline − variant) / baseline on the mean final losses "
        "(positive = the variant is better); the tests pair seed k of both (same batches): a "
        "two-sided paired t-test and the exact sign-flip test (which cannot go below 2/2^n "
        "with n seeds).",
        "",
        table(heads, rows, "llrlrrrrr"),
        "",
        "The best points are chosen on the same runs the test then compares, which favours "
        "whichever variant has the noisier grid (the winner's curse); a confirmation on fresh "
        "seeds at the chosen points is the stricter test.",
        "",
    ]


def stable_section(record: Record, cs: list[Cell]) -> list[str]:
    """The stable learning-rate range of every variant, compared with the baseline's."""
    sweep = record["sweep"]
    within = float(sweep["stable_within"])
    ranges = {v: stable_ranges(cs, sweep["grid"], v, within) for v in sweep["variants"]}
    return [
        "## Stable learning-rate range",
        "",
        *_stable_table(ranges, record["baseline"], within),
    ]


def curves_section(out: Path, record: Record, cs: list[Cell]) -> list[str]:
    """Validation loss along training per variant and learning rate; nothing without curves."""
    grid, variants = record["sweep"]["grid"], record["sweep"]["variants"]
    bands = _curve_bands(cs, grid, variants)
    if not bands:
        return []
    fs = facets(grid)
    p = sweep_plots.curves_by_lr(
        bands,
        variants,
        len(fs),
        [sweep_plots.facet_title(f) for f in fs],
        lr_key(grid),
        out / PLOTS / "sweep_curves.png",
    )
    return [
        "## Curves",
        "",
        *image("validation loss by learning rate", p, out),
        "Validation loss along training per variant and learning rate (mean over seeds); a "
        "diverged run's curve stops at its last validation before it diverged.",
        "",
    ]


def runs_section(rows: list[RunRow]) -> list[str]:
    return [
        "## Runs",
        "",
        _runs_table(rows),
        "",
        f"Also in `{SWEEP_CSV}` (grid values as columns), `results.csv` and `results.json`.",
        "",
    ]


# ------------------------------------------------------------------------------------- helpers


SWEEP_CSV = "sweep.csv"


def _point(point: dict[str, Any]) -> str:
    names = short_names(list(point))
    return ", ".join(f"{names[k]}={format_value(v)}" for k, v in point.items())


def _label(v: str, base: str) -> str:
    return f"{v} (baseline)" if v == base and v != "baseline" else v


def _cell_text(c: Cell | None, best: Cell | None) -> str:
    if c is None or not c.rows:
        return "—"
    flags = [
        f"{c.counts[k]}/{c.n} {k}"
        for k in ("diverged", "pruned", "failed", "running", "missing")
        if c.counts.get(k)
    ]
    if c.counts.get("diverged") and not c.n_ok:
        return f"**diverged** ({c.counts['diverged']}/{c.n})"
    text = pm(c.mean, c.std) if c.n_ok else ""
    if c is best:
        text = f"**{text}**"
    if flags:
        text = f"{text} ({', '.join(flags)})" if text else ", ".join(flags)
    return text


def _grid_tables(cs: list[Cell], grid, variants: Sequence[str], base: str) -> list[str]:
    x = lr_key(grid)
    best = {v: best_cell(cs, v) for v in variants}
    lines = []
    for facet in facets(grid):
        if facet:
            lines += [f"**{sweep_plots.facet_title(facet)}**", ""]
        rows = []
        for value in grid[x]:
            row = [format_value(value)]
            for v in variants:
                cell = next(
                    (
                        c
                        for c in cs
                        if c.variant == v
                        and in_facet(c, facet)
                        and repr(c.point.get(x)) == repr(value)
                    ),
                    None,
                )
                row.append(_cell_text(cell, best[v]))
            rows.append(row)
        heads = [
            short_names(list(grid))[x],
            *(f"{v} (baseline)" if v == base else v for v in variants),
        ]
        lines += [table(heads, rows), ""]
    return lines


def _compare(width: float, base: float) -> str:
    return "wider than" if width > base else "narrower than" if width < base else "the same as"


def _stable_table(ranges: dict[str, list[StableRange]], base: str, within: float) -> list[str]:
    rows = []
    for v, rs in ranges.items():
        for i, r in enumerate(rs):
            cmp = "—"
            if v != base and ranges.get(base):
                b = ranges[base][i]
                word = "wider" if r.width > b.width else "narrower" if r.width < b.width else "same"
                cmp = f"{word} (x{r.width:.3g} vs x{b.width:.3g})"
            rows.append(
                [
                    v,
                    sweep_plots.facet_title(r.facet),
                    ", ".join(f"{x:g}" for x in r.stable) or "none",
                    f"{len(r.stable)}/{len(r.lrs)}",
                    f"x{r.width:.3g}" + ("" if r.contiguous else " (not contiguous)"),
                    sweep_plots.fmt_lr(r.max_not_diverged),
                    cmp,
                ]
            )
    verdicts = []
    for v, rs in ranges.items():
        if v == base or not ranges.get(base):
            continue
        pairs = list(zip(rs, ranges[base]))
        words = [_compare(r.width, b.width) for r, b in pairs]
        if len(set(words)) == 1:
            verdicts.append(f"- {v}: {words[0]} the baseline's at every setting of the grid")
        else:
            verdicts.append(
                f"- {v}: "
                + "; ".join(
                    f"{w} the baseline's at {sweep_plots.facet_title(r.facet)}"
                    for w, (r, _) in zip(words, pairs)
                )
            )
    return [
        *(["Stable range compared with the baseline's:", "", *verdicts, ""] if verdicts else []),
        table(
            [
                "variant",
                "at",
                "stable learning rates",
                "count",
                "width (max/min)",
                "highest lr not diverged",
                "vs baseline",
            ],
            rows,
            "lllrrrl",
        ),
        "",
        f"A learning rate is *stable* for a variant when none of its seeds diverged, was pruned or "
        f"failed, and its mean final loss is within {within:g}% of that variant's best mean final "
        "loss over the whole grid (the threshold is per variant, so a variant is not penalised "
        "for being better or worse overall). *Width* is the largest stable rate over the smallest "
        "(x1 for one rate, x0 for none); *highest lr not diverged* counts every run that did not "
        "diverge, however poor its loss.",
        "",
    ]


def _curve_bands(cs: list[Cell], grid, variants: Sequence[str]) -> dict:
    x = lr_key(grid)
    out: dict[tuple[str, int], dict[float, Band]] = {}
    for j, facet in enumerate(facets(grid)):
        for v in variants:
            for c in cs:
                if c.variant != v or not in_facet(c, facet):
                    continue
                curves = [val_curve(r.run_dir) for r in c.rows if r.status not in ("missing",)]
                curves = [k for k in curves if k]
                if curves:
                    out.setdefault((v, j), {})[float(c.point[x])] = band(curves)
    return out


def _runs_table(rows: list[RunRow]) -> str:
    body = [
        [
            r.variant,
            str(r.seed),
            r.status,
            fmt(r.final_val_loss),
            fmt(r.best_val_loss),
            f"{r.steps:,}",
            fmt(r.wall_time_s, 1),
            f"`{r.schedule_hash[:12]}`" if r.schedule_hash else "—",
            (r.reason or "")[:110],
        ]
        for r in rows
    ]
    return table(
        ["run", "seed", "status", "final val", "best val", "steps", "wall s", "schedule", "note"],
        body,
        "lrlrrrrll",
    )


def write_sweep_csv(out: Path, rows: list[RunRow], record: dict[str, Any]) -> Path:
    """One row per run with the grid values as columns (an edited file is kept aside first)."""
    from attnlab.base.owned import write_owned

    keys = list(record["sweep"]["grid"])
    arm = {v["name"]: v for v in record["variants"]}
    text = io.StringIO(newline="")
    w = csv.writer(text)
    w.writerow(["variant", *keys, "seed", "status", "final_val_loss", "steps", "reason", "run"])
    for r in rows:
        a = arm[r.variant]
        w.writerow(
            [
                a["sweep_variant"],
                *(a["sweep_point"].get(k) for k in keys),
                r.seed,
                r.status,
                "" if r.final_val_loss is None else r.final_val_loss,
                r.steps,
                r.reason or "",
                r.variant,
            ]
        )
    return write_owned(out, SWEEP_CSV, text.getvalue().encode("utf-8"))
