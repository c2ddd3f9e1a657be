"""``attnlab compare`` end to end on a small local corpus: results, report and plots; one schedule
per seed; resume trains nothing; a diverged or failing variant does not stop the rest;
``attnlab report`` rebuilds everything from the run directories."""

from __future__ import annotations

import csv
import json
import textwrap
from pathlib import Path

import pytest

from attnlab.cli import main
from attnlab.experiments import build_report, load_experiment, run_all
from attnlab.runs.rundir import read_status
from tests.helpers.data import tiny_experiment

PLOTS = (
    "val_loss.png",
    "relative_improvement.png",
    "params_vs_loss.png",
    "content_skip_norm.png",
    "attention_skip-id.png",
    "attention_baseline.png",
    "head_weights_skip-id.png",
    "train_identity_weight.png",
    "train_content_skip_norm.png",
)


def experiment_file(folder: Path, data_dir: Path, variants: str, seeds: str = "[0, 1]") -> Path:
    return tiny_experiment(
        folder / "exp.toml", data_dir, variants, seeds=seeds, checkpoint_every=10, device="cpu"
    )


TWO_VARIANTS = """
[evaluate]
tasks = ["perplexity"]
limit = 1

[[variants]]
name = "baseline"
[[variants]]
name = "skip-id"
set = ["model.side_branch.kind=content_skip", "model.readout.kind=identity_head"]
"""


@pytest.fixture(scope="module")
def done(data_dir, tmp_path_factory) -> Path:
    """One full compare: 2 variants x 2 seeds, 10 steps each."""
    root = tmp_path_factory.mktemp("compare")
    path = experiment_file(root, data_dir, TWO_VARIANTS)
    out = root / "out"
    assert main(["compare", str(path), "--out", str(out), "--quiet"]) == 0
    return out


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_results_tables_have_one_row_per_run(done):
    rows = read_csv(done / "results.csv")
    assert [(r["variant"], r["seed"]) for r in rows] == [
        ("baseline", "0"),
        ("baseline", "1"),
        ("skip-id", "0"),
        ("skip-id", "1"),
    ]
    for r in rows:
        assert r["status"] == "finished" and r["steps"] == "10"
        assert float(r["perplexity"]) == pytest.approx(2.718281828 ** float(r["final_val_loss"]))
        assert int(r["tokens"]) == 10 * 4 * 32
        assert float(r["wall_time_s"]) > 0 and float(r["tokens_per_s"]) > 0
        assert r["device"] == "cpu" and r["deterministic"] == "False"
        status = read_status(Path(r["run_dir"]))
        assert float(r["final_val_loss"]) == pytest.approx(status["final_val_loss"])
    assert int(rows[2]["params_non_embedding"]) > int(rows[0]["params_non_embedding"])
    data = json.loads((done / "results.json").read_text())
    assert data["baseline"] == "baseline" and len(data["runs"]) == 4
    assert {r["schedule_hash"] for r in data["runs"]} == {r["schedule_hash"] for r in rows}


def test_evaluation_results_become_columns(done):
    rows = read_csv(done / "results.csv")
    for r in rows:
        stored = json.loads((Path(r["run_dir"]) / "eval" / "results.json").read_text())
        loss = stored["tasks"]["perplexity"]["metrics"]["loss"]
        assert float(r["eval/perplexity/loss"]) == pytest.approx(loss)
        assert float(r["eval/perplexity/bits_per_byte"]) > 0
    assert "eval/perplexity/tokens" not in rows[0]  # counts are not metrics
    report = (done / "report.md").read_text()
    assert "## Evaluation" in report and "perplexity/loss" in report


def test_every_variant_of_a_seed_reads_the_same_schedule(done):
    rows = read_csv(done / "results.csv")
    by_seed = {s: {r["schedule_hash"] for r in rows if r["seed"] == s} for s in ("0", "1")}
    assert all(len(h) == 1 and "" not in h for h in by_seed.values())
    assert by_seed["0"] != by_seed["1"]  # another seed, another batch order
    assert "All runs of each seed share one schedule hash" in (done / "report.md").read_text()


def test_report_and_every_plot_exist(done):
    report = (done / "report.md").read_text()
    for name in PLOTS:
        p = done / "plots" / name
        assert p.is_file() and p.stat().st_size > 1000, name
        assert f"plots/{name}" in report
    assert "## Summary" in report and "p (paired t)" in report
    assert "## Content skip norm" in report and "identity" in report
    skip_id_line = next(line for line in report.splitlines() if line.startswith("| skip-id |"))
    assert "2/2" in skip_id_line and "%" in skip_id_line


def test_rerun_resumes_and_trains_nothing(done):
    exp = load_experiment(done.parent / "exp.toml")
    before = {p: p.stat().st_mtime_ns for p in done.glob("runs/*/seed*/status.json")} | {
        p: p.stat().st_mtime_ns for p in done.glob("runs/*/seed*/metrics.jsonl")
    }
    outcomes = run_all(exp, done)
    assert [o.trained for o in outcomes] == [False] * 4
    assert all(o.status == "finished" for o in outcomes)
    after = {p: p.stat().st_mtime_ns for p in before}
    assert after == before


def test_report_command_rebuilds_from_the_runs(done, capsys):
    old = read_csv(done / "results.csv")
    for p in (done / "plots").glob("*.png"):
        p.unlink()
    (done / "report.md").unlink()
    (done / "results.csv").unlink()
    assert main(["report", str(done)]) == 0
    assert "report.md" in capsys.readouterr().out
    assert read_csv(done / "results.csv") == old
    for name in PLOTS:
        assert (done / "plots" / name).stat().st_size > 1000


def test_a_diverged_variant_is_marked_and_the_rest_completes(data_dir, tmp_path):
    variants = """
    [[variants]]
    name = "baseline"
    [[variants]]
    name = "hot"
    train = { lr = 1e3, min_lr = 1e2, warmup_steps = 0 }
    """
    path = experiment_file(tmp_path, data_dir, textwrap.dedent(variants), seeds="[0]")
    out = tmp_path / "out"
    assert main(["compare", str(path), "--out", str(out), "--quiet"]) == 0
    rows = {r["variant"]: r for r in read_csv(out / "results.csv")}
    assert rows["hot"]["status"] == "diverged" and rows["hot"]["reason"]
    assert rows["baseline"]["status"] == "finished"
    report = (out / "report.md").read_text()
    assert "**diverged**" in report
    hot_line = next(line for line in report.splitlines() if line.startswith("| hot |"))
    assert "0/1" in hot_line


def test_a_failing_run_is_recorded_and_the_experiment_continues(
    data_dir, tmp_path, monkeypatch, capsys
):
    import attnlab.train

    real = attnlab.train.train

    def flaky(cfg, run_dir, **kw):
        if cfg.experiment.variant == "broken":
            raise RuntimeError("simulated crash")
        return real(cfg, run_dir, **kw)

    monkeypatch.setattr(attnlab.train, "train", flaky)
    variants = '[[variants]]\nname = "broken"\n[[variants]]\nname = "fine"\n'
    path = experiment_file(tmp_path, data_dir, variants, seeds="[0]")
    out = tmp_path / "out"
    assert main(["compare", str(path), "--out", str(out), "--quiet", "--set", "baseline=fine"]) == 1
    assert "simulated crash" in capsys.readouterr().err
    rows = {r["variant"]: r for r in read_csv(out / "results.csv")}
    assert rows["broken"]["status"] == "failed" and "simulated crash" in rows["broken"]["reason"]
    assert rows["fine"]["status"] == "finished"
    assert "RuntimeError" in (out / "runs" / "broken" / "seed0" / "error.txt").read_text()
    assert "**failed**" in (out / "report.md").read_text()


def test_only_runs_one_variant_and_the_report_marks_the_rest_missing(data_dir, tmp_path):
    path = experiment_file(tmp_path, data_dir, TWO_VARIANTS, seeds="[0]")
    out = tmp_path / "out"
    assert main(["compare", str(path), "--out", str(out), "--quiet", "--only", "baseline"]) == 0
    rows = {r["variant"]: r for r in read_csv(out / "results.csv")}
    assert rows["baseline"]["status"] == "finished" and rows["skip-id"]["status"] == "missing"
    build_report(out)  # a report with missing runs still renders


def test_a_changed_experiment_is_refused_before_training(data_dir, tmp_path, capsys):
    path = experiment_file(tmp_path, data_dir, '[[variants]]\nname = "baseline"\n', seeds="[0]")
    out = tmp_path / "out"
    assert main(["compare", str(path), "--out", str(out), "--quiet"]) == 0
    code = main(["compare", str(path), "--out", str(out), "--quiet", "--set", "model.d_model=32"])
    assert code == 2
    assert "different config" in capsys.readouterr().err


def test_plan_prints_counts_and_trains_nothing(data_dir, tmp_path, capsys):
    path = experiment_file(tmp_path, data_dir, TWO_VARIANTS)
    assert main(["compare", str(path), "--out", str(tmp_path / "out"), "--plan"]) == 0
    err = capsys.readouterr().err
    assert "skip-id" in err and "non-emb." in err
    assert not (tmp_path / "out").exists()


def test_parallel_jobs_give_the_same_results_as_sequential(done, data_dir, tmp_path):
    path = experiment_file(tmp_path, data_dir, TWO_VARIANTS, seeds="[0]")
    out = tmp_path / "out"
    assert main(["compare", str(path), "--out", str(out), "--quiet", "--jobs", "2"]) == 0
    par = {r["variant"]: r for r in read_csv(out / "results.csv")}
    seq = {r["variant"]: r for r in read_csv(done / "results.csv") if r["seed"] == "0"}
    for v in ("baseline", "skip-id"):
        assert par[v]["status"] == "finished"
        assert float(par[v]["final_val_loss"]) == float(seq[v]["final_val_loss"])
        assert par[v]["schedule_hash"] == seq[v]["schedule_hash"]
        assert par[v]["eval/perplexity/loss"] == seq[v]["eval/perplexity/loss"]


def test_a_vocabulary_too_small_for_the_data_is_refused_before_training(data_dir, tmp_path, capsys):
    path = experiment_file(tmp_path, data_dir, '[[variants]]\nname = "a"\n', seeds="[0]")
    out = tmp_path / "out"
    code = main(
        ["compare", str(path), "--out", str(out), "--quiet", "--set", "model.vocab_size=64"]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "model.vocab_size=64 < 257" in err
    assert not (out / "runs").exists()


def test_report_puts_run_to_run_noise_next_to_the_seed_spread(done):
    """CPU runs are reproducible bit for bit; CUDA runs without train.deterministic are not."""
    from attnlab.experiments.reports.report import noise_note, summarise
    from attnlab.experiments.results import RunRow

    report = (done / "report.md").read_text()
    assert "Run-to-run noise (same seed, same batches): 0: every run is reproducible" in report
    assert "Seed spread (sample std of the baseline's final val loss over seeds): 0." in report

    def row(seed, device, det, loss):
        return RunRow("b", seed, "finished", 1, 1, final_val_loss=loss, device=device,
                      deterministic=det)  # fmt: skip

    cuda = [row(0, "cuda:0", False, 3.0), row(1, "cuda:0", True, 3.2)]
    text = noise_note(cuda, summarise(cuda, ["b"], "b")[0])
    assert "not zero and not measured: 1 of 2 runs on cuda:0 without train.deterministic" in text
    assert "Seed spread (sample std of the baseline's final val loss over seeds): 0.1414" in text


def test_part_statistics_over_training_are_plotted_per_variant(done):
    """The identity head's weight on the identity, logged during training (part/...), is
    plotted against step, and the table holds each layer's last logged value."""
    from attnlab.runs.rundir import read_metrics

    report = (done / "report.md").read_text()
    assert "## Part statistics over training" in report
    section = report.split("### Identity weight", 1)[1].split("###", 1)[0]
    last = read_metrics(done / "runs" / "skip-id" / "seed0")[-1]
    for layer in (0, 1):
        value = last[f"part/identity_weight/{layer}"]
        assert f"| {layer} | {value:.4f} |" in section
    assert read_metrics(done / "runs" / "skip-id" / "seed0")[0]["part/identity_weight"] == (
        pytest.approx(1.0, abs=0.05)
    )
