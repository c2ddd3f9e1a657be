"""Sweeps that train (tiny models, 10 steps): one schedule hash per seed across the grid,
divergence recorded, pruning without breaking exact resume, submitit's local executor giving the
local launcher's results, and the launcher's refusals."""

from __future__ import annotations

import csv
import sys
import textwrap
from pathlib import Path

import pytest

from attnlab.cli import main
from tests.helpers.data import tiny_experiment


def sweep_file(folder: Path, data_dir: Path, sweep: str, seeds: str = "[0, 1]") -> Path:
    variants = """
    [[variants]]
    name = "baseline"
    [[variants]]
    name = "nlq"
    set = ["model.query.kind=nonlinear"]
    """
    return tiny_experiment(
        folder / "sweep.toml",
        data_dir,
        textwrap.dedent(variants) + textwrap.dedent(sweep),
        name="tiny-sweep",
        seeds=seeds,
    )


#: lr 1e3 diverges at once (loss or gradient not finite)
GRID = """
[sweep]
"train.lr" = [3e-3, 1e3]
min_lr_ratio = 0.1
"""


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def swept(data_dir, tmp_path_factory) -> Path:
    """2 variants x 2 learning rates x 2 seeds, 10 steps each, trained here."""
    root = tmp_path_factory.mktemp("sweep")
    out = root / "out"
    assert (
        main(["compare", str(sweep_file(root, data_dir, GRID)), "--out", str(out), "--quiet"]) == 0
    )
    return out


def test_every_run_of_a_seed_reads_one_schedule_across_the_grid(swept):
    rows = read_csv(swept / "results.csv")
    assert len(rows) == 8
    for seed in ("0", "1"):
        ran = [r for r in rows if r["seed"] == seed]
        assert len(ran) == 4 and len({r["schedule_hash"] for r in ran}) == 1
        assert ran[0]["schedule_hash"]
    assert rows[0]["schedule_hash"] != next(r for r in rows if r["seed"] == "1")["schedule_hash"]
    assert "All runs of each seed share one schedule hash" in (swept / "report.md").read_text()


def test_diverged_runs_are_recorded_and_shown_not_dropped(swept):
    rows = read_csv(swept / "sweep.csv")
    hot = [r for r in rows if float(r["train.lr"]) == 1e3]
    assert len(hot) == 4 and all(r["status"] == "diverged" for r in hot)
    assert all(r["reason"] for r in hot)
    cool = [r for r in rows if float(r["train.lr"]) == 3e-3]
    assert all(r["status"] == "finished" and float(r["final_val_loss"]) < 6 for r in cool)
    report = (swept / "report.md").read_text()
    row = next(x for x in report.splitlines() if x.startswith("| 1000 |"))
    assert row.count("**diverged** (2/2)") == 2
    stable = report.split("## Stable learning-rate range")[1]
    assert "| baseline | all runs | 0.003 | 1/2 | x1 | 0.003 |" in stable


def test_pruning_stops_hopeless_points_and_keeps_exact_resume(swept, data_dir, tmp_path):
    grid = """
    [sweep]
    "train.lr" = [1e-5, 3e-3]
    min_lr_ratio = 0.1
    [sweep.prune]
    enabled = true
    at = [5]
    factor = 1.01
    """
    path = sweep_file(tmp_path, data_dir, grid, seeds="[0]")
    out = tmp_path / "out"
    assert main(["compare", str(path), "--out", str(out), "--quiet"]) == 0
    rows = {(r["variant"], r["train.lr"]): r for r in read_csv(out / "sweep.csv")}
    for v in ("baseline", "nlq"):
        slow, fast = rows[(v, "1e-05")], rows[(v, "0.003")]
        assert slow["status"] == "pruned" and slow["steps"] == "5" and "median" in slow["reason"]
        assert fast["status"] == "finished" and fast["steps"] == "10"
    # an unpruned run stopped at the pruning step and resumed: bit for bit the unpaused run
    ref = {
        r["variant"]: r["final_val_loss"]
        for r in read_csv(swept / "sweep.csv")
        if r["seed"] == "0" and float(r["train.lr"]) == 3e-3
    }
    assert rows[("baseline", "0.003")]["final_val_loss"] == ref["baseline"]
    assert rows[("nlq", "0.003")]["final_val_loss"] == ref["nlq"]
    report = (out / "report.md").read_text()
    assert "early stopping (pruning): **on**, at step 5" in report and "(2 runs)" in report
    # with pruning off, a rerun resumes the pruned runs from their checkpoint to the end
    off = path.read_text().replace("enabled = true", "enabled = false")
    path.write_text(off)
    assert main(["compare", str(path), "--out", str(out), "--quiet"]) == 0
    rows = {(r["variant"], r["train.lr"]): r for r in read_csv(out / "sweep.csv")}
    assert rows[("baseline", "1e-05")]["status"] == "finished"
    assert rows[("baseline", "1e-05")]["steps"] == "10"
    assert "early stopping (pruning): off" in (out / "report.md").read_text()


def test_submitit_local_executor_gives_the_local_launchers_results(swept, data_dir, tmp_path):
    pytest.importorskip("submitit")
    path = sweep_file(tmp_path, data_dir, GRID, seeds="[0]")
    out = tmp_path / "out"
    args = ["--quiet", "--launcher", "submitit-local", "--only", "nlq"]
    assert main(["compare", str(path), "--out", str(out), *args]) == 0
    got = {(r["variant"], r["seed"]): r for r in read_csv(out / "results.csv")}
    ref = {(r["variant"], r["seed"]): r for r in read_csv(swept / "results.csv")}
    ran = {k: r for k, r in got.items() if k[0].startswith("nlq@")}
    assert len(ran) == 2
    for key, r in ran.items():
        assert r["status"] == ref[key]["status"]
        assert r["final_val_loss"] == ref[key]["final_val_loss"]
        assert r["schedule_hash"] == ref[key]["schedule_hash"]
    logs = list((out / "submitit").glob("*_0_log.out"))
    assert len(logs) == 2  # one submitit job per run
    assert (out / "report.md").is_file()


def test_missing_submitit_gives_the_install_line(data_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "submitit", None)  # import submitit -> ImportError
    path = sweep_file(tmp_path, data_dir, GRID, seeds="[0]")
    assert main(["compare", str(path), "--out", str(tmp_path / "o"), "--launcher", "slurm"]) == 2
    err = capsys.readouterr().err
    assert 'pip install "submitit>=1.5"' in err and "Traceback" not in err


def test_slurm_without_sbatch_and_bad_executor_args_are_refused(data_dir, tmp_path, capsys):
    pytest.importorskip("submitit")
    import shutil

    path = sweep_file(tmp_path, data_dir, GRID, seeds="[0]")
    out = tmp_path / "o"
    if shutil.which("sbatch") is None:
        assert main(["compare", str(path), "--out", str(out), "--launcher", "slurm"]) == 2
        assert "no sbatch on PATH" in capsys.readouterr().err
    args = ["--launcher", "submitit-local", "--launcher-arg", "slurm_partitin=gpu"]
    assert main(["compare", str(path), "--out", str(out), *args]) == 2
    assert "submitit refused" in capsys.readouterr().err
    assert main(["compare", str(path), "--out", str(out), "--launcher-arg", "x=1"]) == 2
    assert not (out / "runs").exists()


def test_jobs_on_one_gpu_run_one_after_another(data_dir, tmp_path, monkeypatch):
    from attnlab.experiments import load_experiment
    from attnlab.experiments.running import launch

    exp = load_experiment(sweep_file(tmp_path, data_dir, GRID))
    runs = exp.runs(tmp_path / "out")
    monkeypatch.setattr(launch, "cuda_devices", lambda: 1)
    assert launch.effective_jobs(2, runs) == (
        1,
        "--jobs 2 on one GPU: the runs go one after another",
    )
    monkeypatch.setattr(launch, "cuda_devices", lambda: 0)
    assert launch.effective_jobs(2, runs) == (2, None)
    monkeypatch.setattr(launch, "cuda_devices", lambda: 4)
    assert launch.effective_jobs(2, runs) == (2, None)


def test_parallel_grid_points_match_sequential(swept, data_dir, tmp_path):
    path = sweep_file(tmp_path, data_dir, GRID, seeds="[1]")
    out = tmp_path / "out"
    args = ["--quiet", "--jobs", "2", "--only", "baseline"]
    assert main(["compare", str(path), "--out", str(out), *args]) == 0
    ref = {r["variant"]: r for r in read_csv(swept / "results.csv") if r["seed"] == "1"}
    ran = [r for r in read_csv(out / "results.csv") if r["variant"].startswith("baseline@")]
    assert len(ran) == 2
    for r in ran:
        assert (r["status"], r["final_val_loss"]) == (
            ref[r["variant"]]["status"],
            ref[r["variant"]]["final_val_loss"],
        )
