"""``OUT/report.md`` (with ``OUT/plots/*.png``), ``OUT/results.csv`` and ``OUT/results.json``,
rebuilt from the run directories and ``OUT/experiment.json`` alone, so it can be regenerated at
any time (``attnlab report OUT``) without training.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import attnlab
from attnlab.experiments import plots
from attnlab.experiments.curves import Band, band, relative_curve
from attnlab.experiments.part_sections import (
    attention_section,
    layer_stats_section,
    parts_section,
)
from attnlab.experiments.results import RunRow, collect, val_curve, write_results
from attnlab.experiments.runner import read_record
from attnlab.experiments.stats import PairedTest, mean_std, paired_test, relative_improvement

PLOTS = "plots"
ATTENTION_TOKENS = 48


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
        losses = [r.final_val_loss for r in ok]
        lm, ls = mean_std(losses)
        pm, ps = mean_std([r.perplexity for r in ok])
        rel = test = None
        if v != baseline and ok and base_ok:
            rel = relative_improvement(base_mean, lm)
            seeds = [r.seed for r in ok if r.seed in base_ok]
            test = paired_test(
                [base_ok[s] for s in seeds],
                [next(r.final_val_loss for r in ok if r.seed == s) for s in seeds],
            )
        counts: dict[str, int] = {}
        for r in vr:
            counts[r.status] = counts.get(r.status, 0) + 1
        out.append(VariantSummary(v, vr, lm, ls, pm, ps, rel, test, counts))
    return out


# ------------------------------------------------------------------------------------ formatting


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str = "") -> str:
    align = align or "l" + "r" * (len(headers) - 1)
    sep = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(sep) + " |"]
    for r in rows:
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |")
    return "\n".join(lines)


def _f(x: float | None, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:.{digits}f}"


def _pm(mean: float, std: float, digits: int | None = 4) -> str:
    """``mean ± std``; ``digits=None`` picks them from the magnitude (4 below 100, 2 below 1e4,
    else none)."""
    if math.isnan(mean):
        return "—"
    if digits is None:
        digits = 4 if abs(mean) < 100 else 2 if abs(mean) < 1e4 else 0
    if math.isnan(std):
        return f"{mean:,.{digits}f}"
    return f"{mean:,.{digits}f} ± {std:,.{digits}f}"


def _params(n: int) -> str:
    return f"{n:,}"


def _signed_pct(x: float | None, digits: int = 2) -> str:
    if x is None or math.isnan(x):
        return "—"
    return f"{x:+.{digits}f}%"


def _status_counts(counts: dict[str, int]) -> str:
    order = ("finished", "diverged", "failed", "running", "missing")
    parts = [f"{counts[k]} {k}" for k in order if counts.get(k)]
    parts += [f"{n} {k}" for k, n in counts.items() if k not in order]
    return ", ".join(parts)


# ---------------------------------------------------------------------------------- sections


def fairness_section(rows: list[RunRow], seeds: Sequence[int], rule: str) -> list[str]:
    """The report's "Fairness" section: ``rule`` (what must be shared), then per seed the
    schedule hashes its runs read, and a warning when a seed's runs are not paired."""
    text, fair = _fairness(rows, seeds)
    return [
        "## Fairness: one batch schedule per seed",
        "",
        rule,
        "",
        text,
        "",
        "All runs of each seed share one schedule hash."
        if fair
        else "**Warning: some runs of a seed read a different schedule; their comparison is not "
        "paired.**",
        "",
    ]


def _fairness(rows: list[RunRow], seeds: Sequence[int]) -> tuple[str, bool]:
    lines, all_ok = [], True
    table = []
    for s in seeds:
        ran = [r for r in rows if r.seed == s and r.schedule_hash]
        hashes = sorted({r.schedule_hash for r in ran})
        vhashes = sorted({r.val_schedule_hash for r in ran if r.val_schedule_hash})
        shared = len(hashes) == 1
        all_ok &= shared or not ran
        verdict = (
            "yes" if shared else ("no runs yet" if not ran else f"**NO** ({len(hashes)} hashes)")
        )
        table.append(
            [
                str(s),
                f"{len(ran)}",
                ", ".join(f"`{h[:16]}`" for h in hashes) or "—",
                verdict,
                ", ".join(f"`{h[:16]}`" for h in vhashes) or "—",
            ]
        )
    lines.append(
        _table(
            [
                "seed",
                "runs",
                "train schedule hash",
                "one hash for all runs?",
                "validation schedule",
            ],
            table,
            "lrlll",
        )
    )
    return "\n".join(lines), all_ok


def _curves(out: Path, record: dict[str, Any], rows: list[RunRow]):
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


# ------------------------------------------------------------------------------------ report


def _noise(rows: list[RunRow], base: VariantSummary) -> str:
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


def build_report(out_dir: str | Path) -> Path:
    """Write results.csv/json, plots and report.md for the experiment in ``out_dir``."""
    out = Path(out_dir)
    record = read_record(out)
    rows = collect(out, record)
    write_results(out, rows, record)
    if record.get("sweep"):  # a grid: per-variant tables and plots over it instead
        from attnlab.experiments.sweep_report import build_sweep_report

        return build_sweep_report(out, record, rows)
    names = [v["name"] for v in record["variants"]]
    vrec = {v["name"]: v for v in record["variants"]}
    base = record["baseline"]
    summaries = summarise(rows, names, base)
    notes: list[str] = list(record.get("notes", []))
    cfg0 = vrec[base]["config"]
    tps = record["tokens_per_step"]

    lines = [f"# Experiment `{record['name']}`", ""]
    if record.get("description"):
        lines += [record["description"].strip(), ""]
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    d = cfg0["data"]
    lines += [
        f"- experiment file: `{record.get('source') or '?'}`; baseline: **{base}**; seeds: "
        f"{', '.join(map(str, record['seeds']))} (variants are paired by seed)",
        f"- budget: {record['steps']:,} steps x {tps:,} tokens/step = "
        f"{record['steps'] * tps:,} tokens per run",
        f"- data: `{d['corpus']}`, tokenizer `{d['tokenizer']}`, sequence length {d['seq_len']}",
        f"- runs: {len(rows)} ({_status_counts(counts)})",
        *(
            [
                f"- evaluation after training: {', '.join(record['evaluate']['tasks'])}"
                + (f" (limit {record['evaluate']['limit']})" if record["evaluate"]["limit"] else "")
            ]
            if record.get("evaluate")
            else []
        ),
        f"- written {time.strftime('%Y-%m-%d %H:%M:%S')} by attnlab {attnlab.__version__}",
        "",
        "## Summary",
        "",
    ]
    table = []
    for s in summaries:
        vp = vrec[s.name]
        dparams = (
            100.0
            * (vp["params_non_embedding"] - vrec[base]["params_non_embedding"])
            / max(vrec[base]["params_non_embedding"], 1)
        )
        name = f"**{s.name}** (baseline)" if s.name == base else s.name
        wall = [r.wall_time_s for r in s.rows if r.ok and r.wall_time_s]
        tput = [r.tokens_per_s for r in s.rows if r.ok and r.tokens_per_s]
        table.append(
            [
                name,
                _params(vp["params_non_embedding"]),
                "—" if s.name == base else f"{dparams:+.2f}%",
                f"{s.n_ok}/{len(s.rows)}",
                _pm(s.loss_mean, s.loss_std),
                _pm(s.ppl_mean, s.ppl_std, 2),
                "—" if s.name == base else _signed_pct(s.rel_improvement),
                "—" if s.test is None else s.test.describe_t(),
                "—" if s.test is None else s.test.describe_sign_flip(),
                f"{np.mean(wall):.1f}" if wall else "—",
                f"{np.mean(tput):,.0f}" if tput else "—",
            ]
        )
    lines += [
        _table(
            [
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
            ],
            table,
        ),
        "",
        "Final val loss and perplexity: mean ± sample std over the seeds that finished "
        "(diverged and failed runs are left out and counted in *ok runs*). Relative improvement "
        "= 100 · (baseline − variant) / baseline on the mean final validation losses; positive "
        "means lower loss than the baseline (seed 001's convention). *p (paired t)* is the "
        "reported test: a two-sided paired t-test (as `scipy.stats.ttest_rel`; `experiments/student_t.py`) on per-seed final "
        "losses against the baseline's run with the same seed (same batches). *p (sign-flip)* "
        "is the exact sign-flip permutation test on the same differences, which assumes no "
        "distribution but cannot go below 2/2^n with n seeds (0.5 for 2 seeds).",
        "",
        _noise(rows, next(s for s in summaries if s.name == base)),
        "",
    ]
    lines += fairness_section(
        rows,
        record["seeds"],
        "Every variant of a seed must read the same training batches (same data, train.seed, "
        "sequence length, batch and steps) and be scored on the same validation sequences.",
    )
    ptable = []
    for name in names:
        v = vrec[name]
        m = v.get("match")
        match = "—"
        if m:
            match = (
                f"{m['knob']}={m['value']}: {m['achieved']:,} vs {m['target']:,} of "
                f"{m['target_variant']} ({100 * m['rel_gap']:+.3f}%)"
            )
        active = v.get("params_active_non_embedding", v["params_non_embedding"])
        ptable.append(
            [
                name,
                f"{v['params_total']:,}",
                f"{v['params_non_embedding']:,}",
                f"{active:,}" if active != v["params_non_embedding"] else "=",
                ", ".join(f"`{o}`" for o in v["overrides"]) or "(base)",
                match,
            ]
        )
    lines += [
        "## Variants and parameters",
        "",
        _table(
            ["variant", "total", "non-embedding", "active non-emb.", "overrides", "param match"],
            ptable,
            "lrrrll",
        ),
        "",
    ]
    # per-run table
    eval_cols = sorted({k for r in rows for k in r.eval})
    rtable = []
    for r in rows:
        rtable.append(
            [
                r.variant,
                str(r.seed),
                r.status,
                _f(r.final_val_loss),
                _f(r.best_val_loss),
                _f(r.perplexity, 2),
                f"{r.steps:,}",
                f"{r.tokens:,}",
                _f(r.wall_time_s, 1),
                "—" if not r.tokens_per_s else f"{r.tokens_per_s:,.0f}",
                f"`{r.schedule_hash[:12]}`" if r.schedule_hash else "—",
                (r.reason or "")[:120],
            ]
        )
    lines += [
        "## Runs",
        "",
        _table(
            [
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
            ],
            rtable,
            "lrlrrrrrrrll",
        ),
        "",
        "Also in `results.csv` / `results.json`.",
        "",
    ]
    if eval_cols:
        etable = []
        for s in summaries:
            vals = []
            for k in eval_cols:
                xs = [r.eval[k] for r in s.rows if k in r.eval]
                m, sd = mean_std(xs)
                vals.append(_pm(m, sd, None))
            etable.append([s.name, *vals])
        lines += [
            "## Evaluation",
            "",
            "From each run's `eval/results.json` (mean ± std over seeds):",
            "",
            _table(["variant", *eval_cols], etable),
            "",
        ]
    # figures
    loss_bands, rel_bands = _curves(out, record, rows)
    fig_lines = ["## Curves", ""]
    if loss_bands:
        p = plots.val_loss_curves(loss_bands, base, out / PLOTS / "val_loss.png")
        fig_lines += [f"![validation loss]({p.relative_to(out).as_posix()})", ""]
        if any(len(b.steps) < 2 for b in loss_bands.values()):
            notes.append("some curves have a single validation point; lower train.eval_every")
    p = plots.relative_improvement_curves(rel_bands, base, out / PLOTS / "relative_improvement.png")
    fig_lines += [
        f"![relative improvement]({p.relative_to(out).as_posix()})",
        "",
        "Relative improvement along training: 100 · (baseline − variant) / baseline at each "
        "validation step, computed per seed against the baseline run of that seed, then mean "
        "(line) and min-max (band) over seeds.",
        "",
    ]
    points = {
        s.name: (vrec[s.name]["params_non_embedding"], [r.final_val_loss for r in s.rows if r.ok])
        for s in summaries
    }
    p = plots.params_vs_loss(points, base, out / PLOTS / "params_vs_loss.png")
    fig_lines += [f"![parameters vs loss]({p.relative_to(out).as_posix()})", ""]
    lines += fig_lines
    lines += parts_section(record)
    lines += layer_stats_section(out, record, rows, notes)
    lines += attention_section(out, record, rows, notes)
    lines += notes_section(rows, notes, ("diverged", "failed", "running", "missing"))
    return write_report(out, lines)


def notes_section(rows: list[RunRow], notes: list[str], statuses: Sequence[str]) -> list[str]:
    """ "## Notes": each run whose status is in ``statuses`` (with its reason; a failed run's
    traceback file), then ``notes``; nothing when there is neither."""
    problems = [r for r in rows if r.status in statuses]
    if not (problems or notes):
        return []
    lines = ["## Notes", ""]
    for r in problems:
        what = r.reason or ""
        if r.status == "failed":
            what += f" (traceback in `{Path(r.run_dir, 'error.txt')}`)"
        lines.append(f"- {r.variant} seed{r.seed}: **{r.status}** {what}".rstrip())
    return [*lines, *(f"- {n}" for n in notes), ""]


def write_report(out: Path, lines: list[str]) -> Path:
    """``out/report.md``, replaced whole (written beside it, then renamed)."""
    path = out / "report.md"
    tmp = out / "report.md.tmp"
    tmp.write_text("\n".join(lines), encoding="utf-8")
    tmp.replace(path)
    return path
