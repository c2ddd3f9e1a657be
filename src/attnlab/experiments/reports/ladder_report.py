"""A ladder's report, rebuilt from ``OUT/ladder.json`` and its rungs' compare directories alone:
``OUT/report.md``, ``OUT/results.csv`` (one row per rung, variant and seed) and ``OUT/plots/``
(loss vs N with the fits, loss vs C, the gap of every variant vs N).

For every variant: ``L(N) = E + A N^-alpha`` over the rungs with the seeds as replicates, and the
compute form ``L(C)`` (C = 3 F D, attnlab's FLOP counter), with bootstrap intervals
(:func:`~attnlab.experiments.scaling.fit.fit_scaling`); against the baseline, the gap's trend in
log N with its interval and one sentence of verdict, and the fitted gap at GPT-2 small's and
Pythia-1B's N marked as extrapolation (:func:`~attnlab.experiments.scaling.gap.compare_scaling`).
A fit that is not trusted says why instead of printing a number. Cost: 2 + 2 x variants fits
with their bootstraps (about a second each at 1000 replicates).
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

from attnlab.base.atomic import atomic_write_text
from attnlab.base.errors import UserError
from attnlab.experiments.record import read_out_json, read_record
from attnlab.experiments.reports.scaling_plots import gap_vs_size, loss_vs_size
from attnlab.experiments.results import RunRow, collect
from attnlab.experiments.scaling import (
    FitSettings,
    GapFit,
    RungLosses,
    ScalingFit,
    compare_scaling,
    fit_scaling,
    paper_sizes,
)

LADDER_FILE = "ladder.json"
CSV_COLUMNS = (
    "rung", "d_model", "n_layers", "variant", "seed", "N", "C", "lr", "steps", "tokens",
    "status", "final_val_loss",
)  # fmt: skip


def read_ladder(out: Path) -> dict[str, Any]:
    """``OUT/ladder.json``, or a UserError naming the fix."""
    path = out / LADDER_FILE
    rec = read_out_json(out, LADDER_FILE, "ladder")
    if not isinstance(rec, dict) or not isinstance(rec.get("rungs"), list):
        raise UserError(f"{path} is not a ladder record; rerun `attnlab ladder`")
    return rec


def rung_rows(out: Path, rec: dict[str, Any]) -> dict[str, list[RunRow]]:
    """Each rung's run rows by its label (a rung not started yet: none)."""
    rows = {}
    for r in rec["rungs"]:
        where = out / "rungs" / r["label"]
        rows[r["label"]] = collect(where, read_record(where)) if where.is_dir() else []
    return rows


def ladder_points(
    rec: dict[str, Any], rows: dict[str, list[RunRow]], variant: str, size: str
) -> list[RungLosses]:
    """One variant's rungs as (x, losses by seed, diverged seeds), x = ``N`` or ``C_flops``."""
    out = []
    for r in rec["rungs"]:
        mine = [row for row in rows.get(r["label"], []) if row.variant == variant]
        losses = {row.seed: float(row.final_val_loss) for row in mine if row.ok}
        diverged = frozenset(row.seed for row in mine if row.status == "diverged")
        if losses or diverged:
            out.append(RungLosses(float(r["sizes"][variant][size]), losses, diverged))
    return out


def controls(out: Path, rec: dict[str, Any]) -> dict[str, str]:
    """Each ``match_params`` control -> the variant it is matched to (from rung 0's record)."""
    where = out / "rungs" / rec["rungs"][0]["label"]
    if not (where / "experiment.json").is_file():
        return {}
    return {
        v["name"]: v["match"]["target_variant"]
        for v in read_record(where)["variants"]
        if v.get("match") and v["match"].get("target_variant") in rec["variants"]
    }


def build_ladder_report(out_dir: str | Path) -> Path:
    """Write results.csv, plots and report.md of the ladder in ``out_dir``; returns the report."""
    out = Path(out_dir)
    rec = read_ladder(out)
    rows = rung_rows(out, rec)
    settings = FitSettings.model_validate(rec.get("fit") or {})
    base, names = rec["baseline"], list(rec["variants"])
    fits_n = {v: fit_scaling(ladder_points(rec, rows, v, "N"), settings, name=v) for v in names}
    fits_c = {
        v: fit_scaling(ladder_points(rec, rows, v, "C_flops"), settings, name=v, var="C")
        for v in names
    }
    gaps = {
        v: compare_scaling(
            ladder_points(rec, rows, base, "N"),
            ladder_points(rec, rows, v, "N"),
            settings,
            names=(base, v),
        )
        for v in names
        if v != base
    }
    for control, target in controls(out, rec).items():  # each matched variant vs its control
        gaps[f"{target}-vs-{control}"] = compare_scaling(
            ladder_points(rec, rows, control, "N"),
            ladder_points(rec, rows, target, "N"),
            settings,
            names=(control, target),
        )
    targets = {k: float(n) for k, n in paper_sizes().items()}
    plots = out / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    loss_vs_size(fits_n, plots / "loss_vs_N.png", targets)
    loss_vs_size(fits_c, plots / "loss_vs_C.png")
    for v, gap in gaps.items():
        gap_vs_size(gap, plots / f"gap_{v}.png", targets)
    atomic_write_text(out / "results.csv", _csv(rec, rows))
    text = _markdown(rec, rows, fits_n, fits_c, gaps, targets)
    atomic_write_text(out / "report.md", text)
    return out / "report.md"


def _csv(rec: dict[str, Any], rows: dict[str, list[RunRow]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for r in rec["rungs"]:
        lrs = (rec.get("lr") or {}).get(r["label"], {})
        for row in rows.get(r["label"], []):
            size = r["sizes"].get(row.variant, {})
            w.writerow(
                [r["label"], r["d_model"], r["n_layers"], row.variant, row.seed, size.get("N"),
                 size.get("C_flops"), lrs.get(row.variant), r["steps"], r["tokens"], row.status,
                 row.final_val_loss]
            )  # fmt: skip
    return buf.getvalue()


def _how_lr(rec: dict[str, Any]) -> str:
    grid = ", ".join(f"{x:g}" for x in rec["lr_grid"])
    if len(rec["lr_grid"]) == 1:
        return f"train.lr = {grid} at every rung, not tuned ({rec['parametrisation']})"
    if rec["parametrisation"] == "mup":
        return (
            f"µP (model.parametrisation = 'mup', base width = rung 0's d_model): train.lr tuned "
            f"at rung 0 over [{grid}] (seed {rec['tune_seed']}, best final validation loss per "
            "variant) and used at every rung"
        )
    return (
        f"standard parametrisation: train.lr tuned at every rung over [{grid}] (seed "
        f"{rec['tune_seed']}, best final validation loss per variant, the sweep machinery)"
    )


def _lr_notes(rec: dict[str, Any]) -> list[str]:
    """What the tuned learning rates put into the gaps: variants at different rates, and a best
    rate at the edge of the grid."""
    out = []
    for i, t in sorted((rec.get("tuning") or {}).items()):
        lrs = t["lr"]
        if len(set(lrs.values())) > 1:
            out.append(
                f"Note: the variants train at different learning rates (tuned at rung {i}: "
                + ", ".join(f"{v} {x:g}" for v, x in lrs.items())
                + "); every gap includes the difference of their tuned rates, and a rate tuned "
                "where the losses barely differ may not be the best one at the larger rungs."
            )
        if t.get("at_edge"):
            out.append(
                f"Note: at rung {i} the best rate of {', '.join(t['at_edge'])} is at the edge of "
                "the grid; the optimum may lie beyond it."
            )
    return [line for note in out for line in (note, "")]


def _rung_table(rec: dict[str, Any], rows: dict[str, list[RunRow]]) -> list[str]:
    names = list(rec["variants"])
    head = "| rung | d_model | layers | heads | steps | tokens | " + " | ".join(
        f"{v}: N / lr / loss" for v in names
    )
    lines = [head + " |", "|" + "---|" * (6 + len(names))]
    for r in rec["rungs"]:
        lrs = (rec.get("lr") or {}).get(r["label"], {})
        cells = []
        for v in names:
            got = [x.final_val_loss for x in rows.get(r["label"], []) if x.variant == v and x.ok]
            mean = sum(got) / len(got) if got else math.nan
            sd = (
                math.sqrt(sum((g - mean) ** 2 for g in got) / (len(got) - 1))
                if len(got) > 1
                else math.nan
            )
            lr = lrs.get(v)
            cells.append(
                f"{r['sizes'][v]['N']:,} / {lr:g} / {mean:.4f} ± {sd:.4f} ({len(got)})"
                if lr is not None
                else f"{r['sizes'][v]['N']:,} / - / {mean:.4f} ({len(got)})"
            )
        lines.append(
            f"| {r['label']} | {r['d_model']} | {r['n_layers']} | {r['n_heads']} | "
            f"{r['steps']:,} | {r['tokens']:,} | " + " | ".join(cells) + " |"
        )
    return lines


def _control_lines(gaps: dict[str, GapFit]) -> list[str]:
    """The verdict of each variant against its parameter-matched control (same N per rung)."""
    mine = [g for k, g in gaps.items() if "-vs-" in k]
    if not mine:
        return []
    return [
        "Against its parameter-matched control (the same non-embedding N at every rung, so a "
        "gap here is not the parameters'):",
        "",
        *[f"- {g.verdict()}" for g in mine],
        "",
    ]


def _markdown(
    rec: dict[str, Any],
    rows: dict[str, list[RunRow]],
    fits_n: dict[str, ScalingFit],
    fits_c: dict[str, ScalingFit],
    gaps: dict[str, GapFit],
    targets: dict[str, float],
) -> str:
    base = rec["baseline"]
    top = max(r["sizes"][base]["N"] for r in rec["rungs"])
    lo = min(r["sizes"][base]["N"] for r in rec["rungs"])
    lines = [
        f"# Ladder: {rec['name']}",
        "",
        rec.get("description", "").strip(),
        "",
        f"{len(rec['rungs'])} rungs x {len(rec['variants'])} variants x {len(rec['seeds'])} seeds "
        f"({', '.join(map(str, rec['seeds']))}); every rung on D = "
        f"{rec['rule']['tokens_per_param']:g} x N(baseline) tokens, identical batches per seed "
        "across the variants of a rung. Learning rate: " + _how_lr(rec) + ".",
        "",
        *_lr_notes(rec),
        "## Verdicts (gap L(baseline) - L(variant) against N)",
        "",
        *[f"- {g.verdict()}" for k, g in gaps.items() if "-vs-" not in k],
        "",
        *_control_lines(gaps),
        "## Rungs",
        "",
        "N: non-embedding parameters; loss: mean ± sd of the final validation loss (nats/token) "
        "over the finished seeds (count).",
        "",
        *_rung_table(rec, rows),
        "",
        "## Fits: L(N) = E + A N^-alpha",
        "",
        *[f"- {f.summary()}" for f in fits_n.values()],
        "",
        "![loss vs N](plots/loss_vs_N.png)",
        "",
        "## Fits, compute form: L(C) = E + A C^-alpha (C = 3 F D training FLOPs)",
        "",
        *[f"- {f.summary()}" for f in fits_c.values()],
        "",
        "![loss vs C](plots/loss_vs_C.png)",
        "",
        "## Gaps and their extrapolation",
        "",
    ]
    for v, g in gaps.items():
        lines += [f"### {v}", "", g.verdict(), "", g.extrapolation(targets), ""]
        lines += [f"![gap {v}](plots/gap_{v}.png)", ""]
    far = ", ".join(
        f"{k} (N = {n:,.0f}, {n / top:,.0f}x the largest rung)" for k, n in targets.items()
    )
    lines += [
        "## What this says about the papers' scale",
        "",
        f"The rungs span N = {lo:,} to {top:,} non-embedding parameters. {far} lie far outside "
        "them: a fitted gap there is an extrapolation of curves fitted over this span, and it "
        "assumes the power-law form holds (no change of regime) and that the hyperparameters "
        "transfer. The trend verdicts are model-free statements about the trained rungs only.",
        "",
    ]
    return "\n".join(lines)
