"""Sweeps without training: grid expansion, refusals, ``--plan`` and the run budget, and the
sweep report computed from synthetic run directories."""

from __future__ import annotations

import csv
import json
import math
import textwrap
from pathlib import Path

import pytest

from attnlab.cli import main
from attnlab.config import ConfigError
from attnlab.experiments import build_report, load_experiment
from attnlab.experiments.record import write_record
from attnlab.experiments.reports.stats import paired_test
from attnlab.experiments.reports.sweep_analysis import Cell, best_cell, stable_ranges
from attnlab.experiments.results import RunRow

HEAD = """
name = "grid"
seeds = [0, 1]
baseline = "baseline"
[base]
extends = "tiny"
[base.train]
warmup_steps = 2
eval_every = 5
checkpoint_every = 10
[budget]
steps = 20
"""

VARIANTS = """
[[variants]]
name = "baseline"
train = { lr = 6e-4 }
[[variants]]
name = "nlq"
set = ["model.query.kind=nonlinear"]
[[variants]]
name = "mlp"
match_params = "nlq"
"""

GRID = """
[sweep]
"train.lr" = [1e-3, 4e-3, 1.6e-2]
train.weight_decay = [0.0, 0.1]
min_lr_ratio = 0.1
"""


def write(folder: Path, sweep: str = GRID, variants: str = VARIANTS, head: str = HEAD) -> Path:
    path = folder / "exp.toml"
    path.write_text(textwrap.dedent(head + sweep + variants), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------ expansion


def test_grid_expands_into_variant_x_point_x_seed_runs(tmp_path):
    exp = load_experiment(write(tmp_path))
    assert len(exp.variants) == 3 * 3 * 2
    assert list(exp.variants)[:2] == [
        "baseline@lr=0.001,weight_decay=0",
        "baseline@lr=0.001,weight_decay=0.1",
    ]
    runs = exp.runs(tmp_path / "out")
    assert len(runs) == 3 * 6 * 2
    assert [r.seed for r in runs] == [0] * 18 + [1] * 18  # seed-major
    for v in exp.variants.values():
        t = v.config.train
        assert (t.lr, t.weight_decay) == (v.point["train.lr"], v.point["train.weight_decay"])
        assert t.min_lr == pytest.approx(0.1 * t.lr)
        assert t.max_steps == 20
    # the grid replaces a variant's own value, and the plan says so
    assert exp.variants["baseline@lr=0.016,weight_decay=0.1"].config.train.lr == 1.6e-2
    assert any("'baseline' sets train.lr" in n for n in exp.notes)
    # the matched control is sized at every point, and keeps its overrides
    mlp = [v for v in exp.variants.values() if v.base == "mlp"]
    nlq = [v for v in exp.variants.values() if v.base == "nlq"]
    assert {v.params.non_embedding for v in mlp} == {nlq[0].params.non_embedding}
    assert all(any(o.startswith("model.ffn.hidden=") for o in v.overrides) for v in mlp)
    # --only takes a variant name: all its grid points
    only = exp.runs(tmp_path / "out", ["nlq"])
    assert len(only) == 6 * 2 and all(r.variant.startswith("nlq@") for r in only)
    assert only[0].run_dir == tmp_path / "out" / "runs" / "nlq@lr=0.001,weight_decay=0" / "seed0"


def test_record_carries_the_grid(tmp_path):
    exp = load_experiment(write(tmp_path))
    rec = exp.to_record()
    assert rec["sweep"]["grid"] == {
        "train.lr": [1e-3, 4e-3, 1.6e-2],
        "train.weight_decay": [0.0, 0.1],
    }
    assert rec["sweep"]["variants"] == ["baseline", "nlq", "mlp"]
    v = rec["variants"][3]
    assert v["sweep_variant"] == "baseline"
    assert v["sweep_point"] == {"train.lr": 4e-3, "train.weight_decay": 0.1}


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("train.batch_size", "[4, 8]", "decides which batches are read"),
        ("data.seq_len", "[32, 64]", "same batch schedule"),
        ("train.seed", "[0, 1]", "use the seeds list"),
        ("train.max_steps", "[10, 20]", r"use \[budget\]"),
        ("train.eval_every", "[5, 10]", "cannot be swept"),
        ("train.lrr", "[1e-3]", "did you mean 'train.lr'"),
        ("stable_withn", "5", "did you mean 'stable_within'"),
        ("train.lr", "[]", "non-empty list"),
        ("train.lr", "1e-3", "non-empty list"),
        ("train.lr", "[1e-3, 1e-3]", "repeats a value"),
    ],
)
def test_bad_grid_keys_are_refused_with_the_reason(tmp_path, key, value, message):
    with pytest.raises(ConfigError, match=message):
        load_experiment(write(tmp_path, f'[sweep]\n"{key}" = {value}\n'))


def test_a_grid_over_a_matched_width_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="match_params sizes"):
        load_experiment(write(tmp_path, '[sweep]\n"model.ffn.ratio" = [2.0, 4.0]\n'))


def test_pruning_steps_must_be_validation_and_checkpoint_steps(tmp_path):
    grid = '[sweep]\n"train.lr" = [1e-3, 4e-3]\n[sweep.prune]\nenabled = true\n'
    exp = load_experiment(write(tmp_path, grid))
    assert exp.sweep.prune.at == [10]  # the first eval + checkpoint step >= budget / 4
    with pytest.raises(ConfigError, match=r"multiples of train\.eval_every"):
        load_experiment(write(tmp_path, grid + "at = [5]\n"))  # not a checkpoint step
    with pytest.raises(ConfigError, match="below the budget"):
        load_experiment(write(tmp_path, grid + "at = [20]\n"))


def test_set_overrides_sweep_options(tmp_path):
    exp = load_experiment(write(tmp_path), ["sweep.stable_within=2.5", "sweep.max_runs=7"])
    assert exp.sweep.stable_within == 2.5 and exp.sweep.max_runs == 7


# ---------------------------------------------------------------------------- plan and budget


def test_plan_shows_the_grid_the_run_count_and_an_estimate(tmp_path, capsys):
    path = write(tmp_path)
    assert main(["compare", str(path), "--out", str(tmp_path / "out"), "--plan"]) == 0
    err = capsys.readouterr().err
    assert "3 variants x 6 grid points x 2 seeds (0, 1) = 36 runs" in err
    assert "train.lr = 0.001, 0.004, 0.016 (3) x train.weight_decay = 0, 0.1 (2)" in err
    assert "pruning: off" in err and "within 5% of the variant's best" in err
    line = next(x for x in err.splitlines() if x.startswith("estimated time:"))
    assert "for 36 runs with --jobs 1" in line and "baseline" in line and "s/step" in line
    assert not (tmp_path / "out").exists()


def test_a_grid_over_budget_is_refused_with_the_count(tmp_path, capsys):
    path = write(tmp_path)
    out = tmp_path / "out"
    assert main(["compare", str(path), "--out", str(out), "--max-runs", "35"]) == 2
    err = capsys.readouterr().err
    assert "expands to 36 runs (3 variants x 6 grid points x 2 seeds)" in err
    assert "more than --max-runs 35" in err and "Traceback" not in err
    assert not out.exists()
    assert main(["compare", str(path), "--out", str(out), "--set", "sweep.max_runs=20"]) == 2
    assert "more than sweep.max_runs = 20" in capsys.readouterr().err
    assert main(["compare", str(path), "--out", str(out), "--plan", "--max-runs", "36"]) == 0


def test_estimate_scales_with_the_runs_and_jobs(tmp_path):
    from attnlab.experiments.running.estimate import Timing, estimate, run_seconds

    exp = load_experiment(write(tmp_path))
    runs = exp.runs(tmp_path / "out")
    one = estimate(exp, runs[:1])
    assert one.total_s == pytest.approx(run_seconds(runs[0].config, one.timings["baseline"]))
    t = Timing(step_s=0.1, eval_s=0.01, build_s=0.5, how="timed")
    # 20 steps, 4 validations of 4 batches: 2 + 0.16 + 0.5
    assert run_seconds(runs[0].config, t) == pytest.approx(2.66)


# --------------------------------------------------------------------------- synthetic report

LOSSES = {  # (variant, lr, wd) -> final loss per seed; None = diverged
    ("baseline", 1e-3, 0.0): (2.60, 2.62),
    ("baseline", 4e-3, 0.0): (2.50, 2.52),
    ("baseline", 1.6e-2, 0.0): (None, None),
    ("baseline", 1e-3, 0.1): (2.61, 2.63),
    ("baseline", 4e-3, 0.1): (2.51, 2.53),
    ("baseline", 1.6e-2, 0.1): (2.70, None),
    ("nlq", 1e-3, 0.0): (2.58, 2.59),
    ("nlq", 4e-3, 0.0): (2.47, 2.48),
    ("nlq", 1.6e-2, 0.0): (2.52, 2.55),
    ("nlq", 1e-3, 0.1): (2.59, 2.60),
    ("nlq", 4e-3, 0.1): (2.48, 2.50),
    ("nlq", 1.6e-2, 0.1): (2.53, 2.56),
    ("mlp", 1e-3, 0.0): (2.59, 2.61),
    ("mlp", 4e-3, 0.0): (2.49, 2.52),
    ("mlp", 1.6e-2, 0.0): (None, 2.9),
    ("mlp", 1e-3, 0.1): (2.60, 2.62),
    ("mlp", 4e-3, 0.1): (2.50, 2.51),
    ("mlp", 1.6e-2, 0.1): (3.1, 3.2),
}


def fake_runs(out: Path, exp) -> None:
    """status.json and metrics.jsonl for every run, from LOSSES; no training."""
    for r in exp.runs(out):
        v = exp.variants[r.variant]
        key = (v.base, v.point["train.lr"], v.point["train.weight_decay"])
        loss = LOSSES[key][r.seed]
        r.run_dir.mkdir(parents=True)
        status = {
            "status": "finished" if loss is not None else "diverged",
            "step": 20 if loss is not None else 7,
            "final_val_loss": loss,
            "best_val_loss": loss,
            "schedule_hash": f"hash-of-seed-{r.seed}",
            "val_schedule_hash": "val",
            "reason": None if loss is not None else "loss is nan",
        }
        (r.run_dir / "status.json").write_text(json.dumps(status))
        rows = [{"step": 5, "loss": 3.0, "val_loss": 3.0}]
        if loss is not None:
            rows.append({"step": 20, "loss": loss, "val_loss": loss})
        (r.run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))


@pytest.fixture
def synthetic(tmp_path) -> Path:
    exp = load_experiment(write(tmp_path))
    out = tmp_path / "out"
    write_record(exp, out)
    fake_runs(out, exp)
    build_report(out)
    return out


def section(report: str, title: str) -> str:
    return report.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_report_tables_mark_diverged_points_and_best_points(synthetic):
    report = (synthetic / "report.md").read_text()
    grid = section(report, "Final validation loss over the grid")
    wd0 = grid.split("**weight_decay = 0**")[1].split("**weight_decay = 0.1**")[0]
    row = next(x for x in wd0.splitlines() if x.startswith("| 0.016 |"))
    assert "**diverged** (2/2)" in row and "2.5350 ± 0.0212" in row
    assert "2.9000 (1/2 diverged)" in row
    best_row = next(x for x in wd0.splitlines() if x.startswith("| 0.004 |"))
    assert "**2.5100 ± 0.0141**" in best_row and "**2.4750 ± 0.0071**" in best_row
    assert (synthetic / "plots" / "sweep_loss_vs_lr.png").stat().st_size > 5000
    assert (synthetic / "plots" / "sweep_curves.png").stat().st_size > 5000
    assert "early stopping (pruning): off" in report
    assert "All runs of each seed share one schedule hash" in report


def test_best_point_has_its_seed_spread(synthetic):
    best = section((synthetic / "report.md").read_text(), "Best point per variant")
    line = next(x for x in best.splitlines() if x.startswith("| nlq |"))
    assert "lr=0.004, weight_decay=0" in line and "2.4700 – 2.4800 (2 seeds)" in line
    assert "-0.0350" in line  # 2.475 - 2.510


def test_best_vs_best_uses_the_paired_test(synthetic):
    bvb = section((synthetic / "report.md").read_text(), "Best vs best")
    line = next(x for x in bvb.splitlines() if x.startswith("| nlq |"))
    expected = paired_test([2.50, 2.52], [2.47, 2.48])
    assert f"| {expected.describe_t()} |" in line
    rel = 100 * (2.51 - 2.475) / 2.51
    assert f"+{rel:.2f}%" in line


def test_stable_range_counts_lrs_within_x_percent_that_did_not_diverge(synthetic):
    stable = section((synthetic / "report.md").read_text(), "Stable learning-rate range")
    rows = {tuple(c.strip() for c in x.split("|")[1:3]): x for x in stable.splitlines()[2:]}
    assert "- nlq: wider than the baseline's at every setting of the grid" in stable
    assert "- mlp: the same as the baseline's at every setting of the grid" in stable
    # baseline: best 2.51; 5% -> 2.6355: 1e-3 (2.61) and 4e-3 in; 1.6e-2 diverged
    assert "| 0.001, 0.004 | 2/3 | x4 | 0.004 |" in rows[("baseline", "weight_decay = 0")]
    # one seed of 1.6e-2 diverged at wd 0.1: not stable, and not "not diverged"
    assert "| 0.001, 0.004 | 2/3 | x4 | 0.004 |" in rows[("baseline", "weight_decay = 0.1")]
    # nlq: best 2.475 -> 2.59875: all three lrs in at wd 0 (2.585, 2.475, 2.535)
    line = rows[("nlq", "weight_decay = 0")]
    assert "| 0.001, 0.004, 0.016 | 3/3 | x16 | 0.016 | wider (x16 vs x4) |" in line
    # mlp at wd 0.1: 1.6e-2 finished but 3.15 is far off its best: not stable, yet not diverged
    assert (
        "| 0.001, 0.004 | 2/3 | x4 | 0.016 | same (x4 vs x4) |"
        in rows[("mlp", "weight_decay = 0.1")]
    )


def test_sweep_csv_has_the_grid_as_columns(synthetic):
    with open(synthetic / "sweep.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 36
    r = next(x for x in rows if x["variant"] == "baseline" and x["train.lr"] == "0.016")
    assert r["status"] == "diverged" and r["train.weight_decay"] in ("0.0", "0.1")


def test_stable_within_is_configurable(synthetic):
    rec = json.loads((synthetic / "experiment.json").read_text())
    rec["sweep"]["stable_within"] = 1.0
    (synthetic / "experiment.json").write_text(json.dumps(rec))
    build_report(synthetic)
    stable = section((synthetic / "report.md").read_text(), "Stable learning-rate range")
    assert "within 1% of that variant's best" in stable
    line = next(x for x in stable.splitlines() if x.startswith("| nlq | weight_decay = 0 |"))
    assert "| 0.004 | 1/3 | x1 |" in line  # 2.535 > 1.01 x 2.475


# ------------------------------------------------------------------------------------ analysis


def _cell(variant, lr, losses, statuses=None):
    statuses = statuses or ["finished"] * len(losses)
    rows = [
        RunRow(variant, s, st, 1, 1, final_val_loss=x)
        for s, (x, st) in enumerate(zip(losses, statuses))
    ]
    c = Cell(variant, {"train.lr": lr}, rows)
    ok = [x for x, st in zip(losses, statuses) if st == "finished"]
    c.mean = sum(ok) / len(ok) if ok else math.nan
    for st in statuses:
        c.counts[st] = c.counts.get(st, 0) + 1
    return c


def test_best_cell_skips_points_where_a_seed_diverged():
    cs = [
        _cell("a", 1e-3, [2.6, 2.6]),
        _cell("a", 1e-2, [2.4, math.nan], ["finished", "diverged"]),
    ]
    assert best_cell(cs, "a").point == {"train.lr": 1e-3}


def test_stable_range_with_a_gap_is_marked_not_contiguous():
    cs = [
        _cell("a", 1e-3, [2.50]),
        _cell("a", 2e-3, [2.90]),
        _cell("a", 4e-3, [2.52]),
        _cell("a", 8e-3, [2.51], ["pruned"]),
    ]
    (r,) = stable_ranges(cs, {"train.lr": [1e-3, 2e-3, 4e-3, 8e-3]}, "a", 5.0)
    assert r.stable == [1e-3, 4e-3] and not r.contiguous and r.width == pytest.approx(4.0)
    assert r.max_not_diverged == 8e-3  # pruned is not diverged


def test_a_run_paused_for_pruning_is_not_counted_done():
    import io

    from attnlab.experiments.running.progress import ExperimentProgress

    for rich in (False, True):
        p = ExperimentProgress(2, {"a": 1.0, "b": 1.0}, rich=rich, stream=io.StringIO())
        p.begin([("a", 0, 10), ("b", 0, 10)])
        p.start_run("a", 0, 10)
        p.pause_run("a", 0, 5)
        assert p.done == 0 and p.paused == {("a", 0): 5} and p.pending == [("b", 10)]
        p.eta.record("a", 1.0)
        assert p.remaining() == pytest.approx(5 + 10)  # the paused run's 5 steps count
        p.start_run("a", 0, 10)
        assert p.pending == [("b", 10)] and not p.paused  # resuming takes no pending slot
        p.end_run("a", 0, "finished")
        assert p.done == 1
        p.finish()
