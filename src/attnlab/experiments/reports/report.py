"""``OUT/report.md`` of a comparison (an experiment without a ``[sweep]``), with ``OUT/plots/``:
one function per section, in the order the report shows them (:func:`compare_report`).

    header       the experiment, budget, data, runs, evaluation, who wrote it
    summary      mean ± std per variant, relative improvement, paired tests, run-to-run noise
    fairness     one batch schedule per seed (:mod:`~.sections`)
    variants     parameters, overrides and parameter matching per variant
    runs         one row per run, and the evaluation tasks' means per variant
    retrieval    real, mismatched and no neighbours per token class, paired tests (:mod:`~.retrieval_controls`)
    curves       validation loss, relative improvement along training, parameters vs loss
    parts        the parts' own sections (:mod:`~.part_sections`)
    notes        runs that did not finish, and the notes gathered on the way
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.experiments.reports import plots
from attnlab.experiments.reports.curves import Band, band, relative_curve
from attnlab.experiments.reports.lengths import is_length_column, lengths_section
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
from attnlab.experiments.reports.part_sections import (
    attention_section,
    layer_stats_section,
    parts_section,
    train_stats_section,
)
from attnlab.experiments.reports.retrieval_controls import retrieval_section
from attnlab.experiments.reports.sections import fairness_section, notes_section, written_by
from attnlab.experiments.reports.stats import (
    PairedTest,
    mean_std,
    paired_test,
    relative_improvement,
)
from attnlab.experiments.results import RunRow, val_curve

Record = dict[str, Any]

FAIRNESS_RULE = (
    "Every variant of a seed must read the same training batches (same data, train.seed, "
    "sequence length, batch and steps) and be scored on the same validation sequences."
)


@dataclass
class VariantSummary:
    """Seed statistics of one variant against the baseline."""

    name: str
    rows: list[RunRow]
    loss_mean: float
    loss_std: float
    ppl_mean: float
    ppl_std: float
    rel_improvement: float | None
    test: PairedTest | None
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def n_ok(self) -> int:
        return sum(r.ok for r in self.rows)


def summarise(rows: list[RunRow], variants: Sequence[str], baseline: str) -> list[VariantSummary]:
    """Mean ± std per variant, relative improvement of the means, paired tests by seed."""
    by_var = {v: [r for r in rows if r.variant == v] for v in variants}
    base_ok = {r.seed: r.final_val_loss for r in by_var.get(baseline, []) if r.ok}
    base_mean, _ = mean_std(list(base_ok.values()))
    out = []
    for v in variants:
        vr = by_var[v]
        ok = [r for r in vr if r.ok]
        lm, ls = mean_std([r.final_val_loss for r in ok])
        pm_, ps = mean_std([r.perplexity for r in ok])
        rel = test = None
        if v != baseline and ok and base_ok:
            rel = relative_improvement(base_mean, lm)
            seeds = [r.seed for r in ok if r.seed in base_ok]
            test = paired_test(
                [base_ok[s] for s in seeds],
                [next(r.final_val_loss for r in ok if r.seed == s) for s in seeds],
            )
        counts = count_statuses(r.status for r in vr)
        out.append(VariantSummary(v, vr, lm, ls, pm_, ps, rel, test, counts))
    return out


def compare_report(out: Path, record: Record, rows: list[RunRow]) -> Path:
    """Write report.md and the plots of a comparison; returns the report's path."""
    names = [v["name"] for v in record["variants"]]
    summaries = summarise(rows, names, record["baseline"])
    notes: list[str] = list(record.get("notes", []))  # the sections below add to them
    lines = [
        *header_section(record, rows),
        *summary_section(record, rows, summaries),
        *fairness_section(rows, record["seeds"], FAIRNESS_RULE),
        *variants_section(record),
        *runs_section(rows),
        *evaluation_section(rows, summaries),
        *retrieval_section(rows),
        *lengths_section(out, rows),
        *curves_section(out, record, rows, summaries, notes),
        *parts_section(record),
        *layer_stats_section(out, record, rows, notes),
        *train_stats_section(out, record, rows, notes),
        *attention_section(out, record, rows, notes),
        *notes_section(rows, notes, ("diverged", "failed", "running", "missing")),
    ]
    return write_report(out, lines)


# ------------------------------------------------------------------------------------ sections


def header_section(record: Record, rows: list[RunRow]) -> list[str]:
    """The title, the description and one bullet per fact of the experiment."""
    lines = [f"# Experiment `{record['name']}`", ""]
    if record.get("description"):
        lines += [record["description"].strip(), ""]
    base, tps = record["baseline"], record["tokens_per_step"]
    d = next(v for v in record["variants"] if v["name"] == base)["config"]["data"]
    evaluate = record.get("evaluate")
    lines += [
        f"- experiment file: `{record.get('source') or '?'}`; baseline: **{base}**; seeds: "
        f"{', '.join(map(str, record['seeds']))} (variants are paired by seed)",
        f"- budget: {record['steps']:,} steps x {tps:,} tokens/step = "
        f"{record['steps'] * tps:,} tokens per run",
        f"- data: `{d['corpus']}`, tokenizer `{d['tokenizer']}`, sequence length {d['seq_len']}",
        f"- runs: {len(rows)} ({status_counts(count_statuses(r.status for r in rows))})",
    ]
    if evaluate:
        limit = f" (limit {evaluate['limit']})" if evaluate["limit"] else ""
        lines.append(f"- evaluation after training: {', '.join(evaluate['tasks'])}{limit}")
    return [*lines, written_by(), ""]


def summary_section(
    record: Record, rows: list[RunRow], summaries: list[VariantSummary]
) -> list[str]:
    """One row per variant against the baseline, what the columns mean, and the noise."""
    vrec = {v["name"]: v for v in record["variants"]}
    base = record["baseline"]
    base_n = vrec[base]["params_non_embedding"]
    cells = []
    for s in summaries:
        n = vrec[s.name]["params_non_embedding"]
        wall = [r.wall_time_s for r in s.rows if r.ok and r.wall_time_s]
        tput = [r.tokens_per_s for r in s.rows if r.ok and r.tokens_per_s]
        is_base = s.name == base
        cells.append(
            [
                f"**{s.name}** (baseline)" if is_base else s.name,
                f"{n:,}",
                "—" if is_base else f"{100.0 * (n - base_n) / max(base_n, 1):+.2f}%",
                f"{s.n_ok}/{len(s.rows)}",
                pm(s.loss_mean, s.loss_std),
                pm(s.ppl_mean, s.ppl_std, 2),
                "—" if is_base else signed_pct(s.rel_improvement),
                "—" if s.test is None else s.test.describe_t(),
                "—" if s.test is None else s.test.describe_sign_flip(),
                f"{np.mean(wall):.1f}" if wall else "—",
                f"{np.mean(tput):,.0f}" if tput else "—",
            ]
        )
    heads = [
        "variant",
        "non-emb. params",
        "Δ params",
        "ok runs",
        "final val loss",
        "perplexity",
        "rel. improvement",
        "p (paired t)",
        "p (sign-flip)",
        "wall s/run",
        "tokens/s",
    ]
    base_summary = next(s for s in summaries if s.name == base)
    return [
        "## Summary",
        "",
        table(heads, cells),
        "",
        SUMMARY_TEXT,
        "",
        noise_note(rows, base_summary),
        "",
    ]


SUMMARY_TEXT = (
    "Final val loss and perplexity: mean ± sample std over the seeds that finished "
    "(diverged and failed runs are left out and counted in *ok runs*). Relative improvement "
    "= 100 · (baseline − variant) / baseline on the mean final validation losses; positive "
    "means lower loss than the baseline (seed 001's convention). *p (paired t)* is the "
    "reported test: a two-sided paired t-test (as `scipy.stats.ttest_rel`; "
    "`experiments/reports/student_t.py`) on per-seed final "
    "losses against the baseline's run with the same seed (same batches). *p (sign-flip)* "
    "is the exact sign-flip permutation test on the same differences, which assumes no "
    "distribution but cannot go below 2/2^n with n seeds (0.5 for 2 seeds)."
)


def noise_note(rows: list[RunRow], base: VariantSummary) -> str:
    """Run-to-run noise (a rerun of the same seed) next to the seed spread of the baseline."""
    ok = [r for r in rows if r.ok]
    exact = [r for r in ok if r.deterministic or r.device.startswith("cpu")]
    loose = sorted({r.device for r in ok if r not in exact})
    if len(exact) == len(ok):
        noise = (
            "0: every run is reproducible bit for bit (train.deterministic, or CPU kernels at "
            "a fixed thread count)"
        )
    else:
        noise = (
            f"not zero and not measured: {len(ok) - len(exact)} of {len(ok)} runs on "
            f"{', '.join(loose)} without train.deterministic, so a rerun of the same seed differs "
            "in the last digits; set train.deterministic=true to remove it"
        )
    spread = "—" if math.isnan(base.loss_std) else f"{base.loss_std:.4f}"
    return (
        f"Run-to-run noise (same seed, same batches): {noise}. Seed spread (sample std of the "
        f"baseline's final val loss over seeds): {spread}."
    )


def variants_section(record: Record) -> list[str]:
    """Parameters (total, non-embedding, active), overrides and matching of every variant."""
    cells = []
    for v in record["variants"]:
        m = v.get("match")
        match = "—"
        if m:
            match = (
                f"{m['knob']}={m['value']}: {m['achieved']:,} vs {m['target']:,} of "
                f"{m['target_variant']} ({100 * m['rel_gap']:+.3f}%)"
            )
        active = v.get("params_active_non_embedding", v["params_non_embedding"])
        cells.append(
            [
                v["name"],
                f"{v['params_total']:,}",
                f"{v['params_non_embedding']:,}",
                f"{active:,}" if active != v["params_non_embedding"] else "=",
                ", ".join(f"`{o}`" for o in v["overrides"]) or "(base)",
                match,
            ]
        )
    heads = ["variant", "total", "non-embedding", "active non-emb.", "overrides", "param match"]
    return ["## Variants and parameters", "", table(heads, cells, "lrrrll"), ""]


def runs_section(rows: list[RunRow]) -> list[str]:
    """One row per run (also in results.csv / results.json)."""
    cells = [
        [
            r.variant,
            str(r.seed),
            r.status,
            fmt(r.final_val_loss),
            fmt(r.best_val_loss),
            fmt(r.perplexity, 2),
            f"{r.steps:,}",
            f"{r.tokens:,}",
            fmt(r.wall_time_s, 1),
            "—" if not r.tokens_per_s else f"{r.tokens_per_s:,.0f}",
            f"`{r.schedule_hash[:12]}`" if r.schedule_hash else "—",
            (r.reason or "")[:120],
        ]
        for r in rows
    ]
    heads = [
        "variant",
        "seed",
        "status",
        "final val",
        "best val",
        "ppl",
        "steps",
        "tokens",
        "wall s",
        "tokens/s",
        "schedule",
        "note",
    ]
    return [
        "## Runs",
        "",
        table(heads, cells, "lrlrrrrrrrll"),
        "",
        "Also in `results.csv` / `results.json`.",
        "",
    ]


def evaluation_section(rows: list[RunRow], summaries: list[VariantSummary]) -> list[str]:
    """Mean ± std over seeds of every ``eval/results.json`` metric; nothing without any."""
    cols = sorted({k for r in rows for k in r.eval if not is_length_column(k)})
    if not cols:
        return []
    cells = []
    for s in summaries:
        values = [pm(*mean_std([r.eval[k] for r in s.rows if k in r.eval]), None) for k in cols]
        cells.append([s.name, *values])
    return [
        "## Evaluation",
        "",
        "From each run's `eval/results.json` (mean ± std over seeds):",
        "",
        table(["variant", *cols], cells),
        "",
    ]


def curves_section(
    out: Path,
    record: Record,
    rows: list[RunRow],
    summaries: list[VariantSummary],
    notes: list[str],
) -> list[str]:
    """The three figures: validation loss, relative improvement along training (per seed
    against the baseline's run of that seed), and parameters vs final loss."""
    base = record["baseline"]
    loss_bands, rel_bands = _curves(record, rows)
    lines = ["## Curves", ""]
    if loss_bands:
        p = plots.val_loss_curves(loss_bands, base, out / PLOTS / "val_loss.png")
        lines += image("validation loss", p, out)
        if any(len(b.steps) < 2 for b in loss_bands.values()):
            notes.append("some curves have a single validation point; lower train.eval_every")
    p = plots.relative_improvement_curves(rel_bands, base, out / PLOTS / "relative_improvement.png")
    lines += [
        *image("relative improvement", p, out),
        "Relative improvement along training: 100 · (baseline − variant) / baseline at each "
        "validation step, computed per seed against the baseline run of that seed, then mean "
        "(line) and min-max (band) over seeds.",
        "",
    ]
    vrec = {v["name"]: v for v in record["variants"]}
    points = {
        s.name: (vrec[s.name]["params_non_embedding"], [r.final_val_loss for r in s.rows if r.ok])
        for s in summaries
    }
    p = plots.params_vs_loss(points, base, out / PLOTS / "params_vs_loss.png")
    return [*lines, *image("parameters vs loss", p, out)]


def _curves(record: Record, rows: list[RunRow]) -> tuple[dict[str, Band], dict[str, Band]]:
    """Validation-loss bands per variant, and relative-improvement bands against the baseline."""
    names = [v["name"] for v in record["variants"]]
    per_var: dict[str, dict[int, list[tuple[int, float]]]] = {n: {} for n in names}
    for r in rows:
        if r.status in ("missing", "failed") and not Path(r.run_dir, "metrics.jsonl").is_file():
            continue
        c = val_curve(r.run_dir)
        if c:
            per_var[r.variant][r.seed] = c
    loss_bands = {n: band(list(per_var[n].values())) for n in names if per_var[n]}
    base = record["baseline"]
    rel_bands: dict[str, Band] = {}
    if per_var.get(base):
        for n in names:
            if n != base and per_var[n]:
                rel_bands[n] = relative_curve(per_var[base], per_var[n])
    return loss_bands, rel_bands
