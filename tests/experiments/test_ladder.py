"""``attnlab ladder`` end to end on a 3-rung tiny ladder (one run of the command, interrupted
once and resumed): the rungs' shapes and budgets, µP's learning rate tuned at rung 0 and used at
every rung, identical batches per seed across variants, the MLP-widened control matched at every
size, report and plots; rerunning one rung reproduces its loss bit for bit; a largest rung that
will not fit is refused with the fix; the plan's printout and its FLOPs."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import pytest

from attnlab.base.errors import UserError
from attnlab.cli import main
from attnlab.config import ConfigError, load_config
from attnlab.experiments.ladder import LadderRequest, ladder, plan_ladder
from attnlab.experiments.ladder import run as ladder_run
from attnlab.experiments.load import load_spec
from attnlab.model import build_model
from attnlab.model.params import count
from attnlab.runs.preflight import PreflightError
from attnlab.runs.rundir import read_status

WIDTHS = [16, 32, 48]
TOKENS_PER_PARAM = 0.05
VARIANTS = """
[[variants]]
name = "baseline"
[[variants]]
name = "preproj-skip"
set = ["model.feature_map.kind=pre_projection", "model.side_branch.kind=content_skip"]
[[variants]]
name = "mlp-matched"
match_params = "preproj-skip"
"""


def ladder_file(folder: Path, data_dir: Path, ladder_table: str, variants: str = VARIANTS) -> Path:
    """A ladder experiment on the suite's byte data: T = 16, B = 2, one thread."""
    text = f"""
name = "tiny-ladder"
description = "A tiny ladder of the test suite."
seeds = [0, 1]
[base]
extends = "tiny"
[base.model]
max_seq_len = 16
[base.data]
dir = {json.dumps(str(data_dir))}
corpus = {json.dumps(str(data_dir.parent / "corpus.jsonl"))}
seq_len = 16
[base.train]
batch_size = 2
warmup_steps = 1
eval_every = 5
eval_batches = 1
checkpoint_every = 5
log_every = 5
threads = 1
device = "cpu"
[ladder]
{ladder_table}
{variants}
"""
    path = folder / "ladder.toml"
    path.write_text(text, encoding="utf-8")
    return path


TABLE = f"widths = {WIDTHS}\nhead_dim = 16\naspect = 64\ntokens_per_param = {TOKENS_PER_PARAM}\nlr = [3e-3, 1e-2]"


class Interrupt(KeyboardInterrupt):
    """What the test's kill raises, in the middle of the ladder."""


@pytest.fixture(scope="module")
def done(data_dir, tmp_path_factory):
    """The ladder run once, killed (KeyboardInterrupt) when it reaches its last rung, then run
    again to the end; returns (out, the first call's rung labels, the second call's result)."""
    root = tmp_path_factory.mktemp("ladder")
    path = ladder_file(root, data_dir, TABLE)
    out = root / "out"
    req = LadderRequest(path, out, quiet=True)
    real = ladder_run.run_all
    started: list[Path] = []

    def killed_at_the_last_rung(exp, where, **kw):
        started.append(Path(where))
        if Path(where).name.startswith("r2-"):
            raise Interrupt
        return real(exp, where, **kw)

    ladder_run.run_all = killed_at_the_last_rung
    try:
        with pytest.raises(Interrupt):
            ladder(req, lambda line: None)
    finally:
        ladder_run.run_all = real
    lines: list[str] = []
    result = ladder(req, lines.append)
    return out, started, result, lines, path


def _rows(out: Path) -> list[dict]:
    with open(out / "results.csv", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_the_ladder_trains_every_rung_variant_and_seed_and_reports(done):
    out, _, result, _, _ = done
    assert not result.failed
    rows = _rows(out)
    assert len(rows) == len(WIDTHS) * 3 * 2
    assert {r["status"] for r in rows} == {"finished"}
    assert all(math.isfinite(float(r["final_val_loss"])) for r in rows)
    text = (out / "report.md").read_text(encoding="utf-8")
    for v in ("preproj-skip", "mlp-matched"):
        assert f"{v} vs baseline: the gap L(baseline) - L({v})" in text
        assert (out / "plots" / f"gap_{v}.png").stat().st_size > 0
    assert (out / "plots" / "loss_vs_N.png").stat().st_size > 0
    # the matched variant against its control, at the same N per rung
    assert "Against its parameter-matched control" in text
    assert "preproj-skip vs mlp-matched: the gap L(mlp-matched) - L(preproj-skip)" in text
    assert (out / "plots" / "gap_preproj-skip-vs-mlp-matched.png").stat().st_size > 0
    assert "at rung 0" in text and "used at every rung" in text  # which lr rule was used
    assert "124M" in text and "extrapolation" in text


def test_rungs_have_their_shapes_budgets_and_mup_base(done):
    out, *_ = done
    rec = json.loads((out / "ladder.json").read_text(encoding="utf-8"))
    for r, width in zip(rec["rungs"], WIDTHS):
        assert r["d_model"] == width
        n = r["sizes"]["baseline"]["N"]
        per_step = 2 * 16
        assert TOKENS_PER_PARAM * n <= r["tokens"] < TOKENS_PER_PARAM * n + per_step
        cfg = json.loads(
            (out / "rungs" / r["label"] / "experiment.json").read_text(encoding="utf-8")
        )
        for v in cfg["variants"]:
            m = v["config"]["model"]
            assert (m["d_model"], m["parametrisation"], m["mup_base_width"]) == (width, "mup", 16)
            assert v["config"]["train"]["max_steps"] == r["steps"]


def test_mup_uses_the_lr_tuned_at_rung_0_at_every_rung(done):
    out, *_ = done
    rec = json.loads((out / "ladder.json").read_text(encoding="utf-8"))
    assert rec["tuned_rungs"] == [0]
    tuning = rec["tuning"]["0"]
    for v, lr in tuning["lr"].items():
        losses = {float(k): x for k, x in tuning["losses"][v].items()}
        assert lr == min((x, k) for k, x in losses.items() if x is not None)[1]
    for label, lrs in rec["lr"].items():
        assert lrs == tuning["lr"]
        exp = json.loads((out / "rungs" / label / "experiment.json").read_text(encoding="utf-8"))
        for v in exp["variants"]:
            train = v["config"]["train"]
            assert train["lr"] == lrs[v["name"]]
            assert train["min_lr"] == pytest.approx(0.1 * lrs[v["name"]])
    # the tuning sweep ran every grid point of every variant at rung 0, one seed
    tune = out / "tune" / rec["rungs"][0]["label"] / "runs"
    assert len(list(tune.glob("*/seed0"))) == 3 * 2


def test_the_control_is_matched_and_batches_are_identical_at_every_rung(done):
    out, *_ = done
    rec = json.loads((out / "ladder.json").read_text(encoding="utf-8"))
    for r in rec["rungs"]:
        target = r["sizes"]["preproj-skip"]["N"]
        got = r["sizes"]["mlp-matched"]["N"]
        assert abs(got - target) / target < 0.05
        assert got != r["sizes"]["baseline"]["N"]
        where = out / "rungs" / r["label"]
        with open(where / "results.csv", encoding="utf-8") as f:
            runs = list(csv.DictReader(f))
        for seed in ("0", "1"):
            hashes = {x["schedule_hash"] for x in runs if x["seed"] == seed}
            assert len(hashes) == 1 and "" not in hashes
        assert len({x["schedule_hash"] for x in runs}) == 2  # the seeds read different batches


def test_a_killed_ladder_resumes_without_training_the_finished_rungs_again(done):
    _, started, result, lines, _ = done
    assert [p.parent.name for p in started] == ["tune", "rungs", "rungs", "rungs"]
    first, second, third = (result.outcomes[r] for r in result.outcomes)
    assert not any(o.trained for o in first + second)  # over before the kill: skipped
    assert all(o.trained for o in third)
    assert any(line.startswith("total: ") for line in lines)


def test_rerunning_one_rung_reproduces_its_loss_bit_for_bit(done):
    out, _, _, _, path = done
    rec = json.loads((out / "ladder.json").read_text(encoding="utf-8"))
    run = out / "rungs" / rec["rungs"][1]["label"] / "runs" / "preproj-skip" / "seed1"
    before = read_status(run)["final_val_loss"]
    shutil.rmtree(run)
    again = ladder(LadderRequest(path, out, quiet=True), lambda line: None)
    trained = [o for rung in again.outcomes.values() for o in rung if o.trained]
    assert [(o.variant, o.seed) for o in trained] == [("preproj-skip", 1)]
    assert read_status(run)["final_val_loss"] == before


# ------------------------------------------------------------------ plan, cost, refusals


@pytest.fixture(scope="module")
def plan_file(data_dir, tmp_path_factory):
    return ladder_file(tmp_path_factory.mktemp("plan"), data_dir, TABLE)


def test_the_plan_prints_rungs_flops_and_a_timed_estimate_and_writes_nothing(plan_file, tmp_path):
    lines: list[str] = []
    out = tmp_path / "never"
    assert ladder(LadderRequest(plan_file, out, plan=True), lines.append).outcomes == {}
    assert not out.exists()
    spec, _ = load_spec(plan_file)
    plan = plan_ladder(spec, folder=plan_file.parent)
    flops = 0.0
    for r, width in zip(plan.rungs, WIDTHS):
        line = next(x for x in lines if x.startswith(f"  r{r.shape.index}-d{width}:"))
        assert f"{r.steps:,} steps = {r.tokens:,} tokens" in line
        for name, v in r.experiment.variants.items():
            model = build_model(v.config.model)  # attnlab's FLOP counter, counted again here
            f = model.flops_per_token(v.config.data.seq_len)
            assert f"{name} {count(v.config.model).non_embedding:,}" in line
            flops += 3 * f * r.tokens * (2 + (2 if r.shape.index == 0 else 0))
    total = next(x for x in lines if x.startswith("total: "))
    assert total.startswith(f"total: {len(WIDTHS) * 3 * 2} runs + {3 * 2} tuning runs; ")
    assert f"{flops:.3g} training FLOPs" in total
    assert "estimated time " in total and "load average" in total
    assert any("µP relative to rung 0 (d_model 16)" in x for x in lines)


def test_a_largest_rung_that_will_not_fit_is_refused_with_the_fix(plan_file, tmp_path, monkeypatch):
    from attnlab.runs import preflight

    monkeypatch.setattr(preflight, "free_memory", lambda device: 10_000)
    with pytest.raises(PreflightError) as e:
        ladder(LadderRequest(plan_file, tmp_path / "o", plan=True), lambda line: None)
    msg = str(e.value)
    assert "attnlab ladder needs at least" in msg
    assert "largest rung (r2-d48: d_model=48, n_layers=2)" in msg
    assert "--set ladder.rungs=2" in msg
    assert main(["ladder", str(plan_file), "--out", str(tmp_path / "o"), "--plan"]) != 0


def test_without_mup_the_lr_is_tuned_at_every_rung(plan_file):
    spec, _ = load_spec(plan_file, ["ladder.parametrisation=standard"])
    plan = plan_ladder(spec, folder=plan_file.parent)
    assert plan.tuned_rungs() == [0, 1, 2]
    assert all(plan.lr_source(i) == i for i in range(3))
    cfg = plan.rungs[2].experiment.variants["baseline"].config.model
    assert cfg.parametrisation == "standard"
    spec, _ = load_spec(plan_file, ["ladder.lr=[0.003]"])
    assert plan_ladder(spec, folder=plan_file.parent).tuned_rungs() == []


@pytest.mark.fast
@pytest.mark.parametrize(
    ("table", "words"),
    [
        ("tokens_per_param = 1", "needs rungs = N"),
        ("widths = [16, 32]\nrungs = 3", "ladder.rungs = 3 but ladder.widths has 2"),
        ("rungs = 3\nlr = [0.01, 0.01]", "repeats a value"),
        ("rungs = 3\n[budget]\nsteps = 5", "remove [budget]"),
        ('rungs = 3\n[sweep]\n"train.lr" = [0.01]', "remove [sweep]"),
    ],
)
def test_a_bad_ladder_table_names_the_fix(data_dir, tmp_path, table, words):
    path = ladder_file(tmp_path, data_dir, table)
    with pytest.raises(ConfigError, match=words.replace("[", r"\[").replace("]", r"\]")):
        load_spec(path)


def test_compare_refuses_a_ladder_and_ladder_a_plain_experiment(plan_file, data_dir, tmp_path):
    with pytest.raises(ConfigError, match="run it with `attnlab ladder`"):
        from attnlab.experiments import load_experiment

        load_experiment(plan_file)
    plain = tmp_path / "plain.toml"
    plain.write_text(
        'base = "tiny"\n[budget]\nsteps = 5\n[[variants]]\nname = "baseline"\n', encoding="utf-8"
    )
    with pytest.raises(UserError, match=r"has no \[ladder\] table"):
        ladder(LadderRequest(plain, tmp_path / "o", plan=True), lambda line: None)


@pytest.mark.fast
def test_mup_base_width_must_hold_whole_heads():
    with pytest.raises(ConfigError, match="mup_base_width=40 is not a multiple"):
        load_config(
            "tiny",
            ["model.parametrisation=mup", "model.mup_base_width=40", "model.attention.head_dim=16"],
        )
