"""Issue 36, the content controls of a retrieval evaluation: every window is scored with its real
neighbours, with another window's (a seeded derangement: the ids fed differ, the same for a
seed) and with none, per token class of the planted-fact corpus (the answer tokens apart), and
the report states the gain as real-vs-mismatched with a paired test, in `attnlab eval` and in
the compare report. A tiny retrieval model of a few steps on a small planted-fact corpus."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("bm25s")

from attnlab.base.errors import UserError
from attnlab.cli import main
from attnlab.data import TokenData
from attnlab.data.preparation import read_meta
from attnlab.data.synth_facts import FactsSpec, generate, load_statements
from attnlab.eval.mismatch import mismatched_windows
from attnlab.runs.load import run_config
from tests.helpers.data import tiny_run_config


@pytest.fixture(scope="module")
def facts_run(tmp_path_factory):
    """A 6-step retrieval run (chunks of 8 bytes, T = 32) on 40 planted facts."""
    from attnlab.train import train

    root = tmp_path_factory.mktemp("controls")
    data = root / "facts"
    generate(data, FactsSpec(facts=40, key_len=12, filler_sentences=1))
    corpus = read_meta(data)["corpus_spec"]
    cfg = tiny_run_config(
        data,
        f"data.corpus={json.dumps(corpus)}",
        "model.family=retrieval",
        "model.retrieval.chunk_size=8",
        steps=6,
        eval_every=3,
    )
    train(cfg, root / "run")
    return root / "run", data


@pytest.mark.fast
@pytest.mark.parametrize("n", [2, 3, 7, 50])
def test_mismatched_windows_are_a_seeded_derangement(n):
    src = mismatched_windows(n, seed=0)
    assert sorted(src.tolist()) == list(range(n))  # every window's neighbours used once
    assert (src != np.arange(n)).all()  # never a window's own
    assert (mismatched_windows(n, seed=0) == src).all()


@pytest.mark.fast
def test_another_seed_draws_another_mismatch_and_one_window_is_refused():
    assert (mismatched_windows(50, seed=0) != mismatched_windows(50, seed=1)).any()
    with pytest.raises(UserError, match="at least 2 validation windows"):
        mismatched_windows(1)


def _fed(monkeypatch):
    """Record the neighbours every forward of the evaluated model is given (None: none)."""
    import attnlab.runs.load as load

    fed: list = []
    real_load = load.load_run_model

    def spying(*args, **kwargs):
        model, cfg, rest = real_load(*args, **kwargs)

        def hook(_module, _args, kw):
            n = kw.get("neighbours")
            fed.append(None if n is None else n.clone())

        model.register_forward_pre_hook(hook, with_kwargs=True)
        return model, cfg, rest

    monkeypatch.setattr(load, "load_run_model", spying)
    return fed


def test_mismatched_neighbours_are_another_windows_and_are_fed(facts_run, monkeypatch):
    from attnlab.data.retrieval import Database, database_dir, sequence_neighbours
    from attnlab.eval.retrieval import retrieval_losses

    run, data_dir = facts_run
    fed = _fed(monkeypatch)
    res = retrieval_losses(run, max_windows=6, batch_size=6, control_seed=3)
    data = TokenData.open(data_dir)
    db = Database.open(database_dir(data_dir, 8, 2, 8))
    _, real = sequence_neighbours(db, data, "val", np.arange(6) * 32, 32)
    with_nbr = [f for f in fed if f is not None]
    assert len(with_nbr) == 2 and fed.count(None) == 1  # real, mismatched, none: one batch
    got_real, got_mis = (f.numpy() for f in with_nbr)
    assert (got_real == real).all()
    assert (got_mis == real[mismatched_windows(6, seed=3)]).all()
    for w in range(6):  # the ids differ window by window
        assert not np.array_equal(got_mis[w], got_real[w])
    assert res["loss_mismatched"] != res["loss_with"]  # and the model sees the difference
    assert res["control_seed"] == 3


def test_controls_are_reproducible_for_a_seed(facts_run):
    from attnlab.eval.retrieval import retrieval_losses

    run, _ = facts_run
    a = retrieval_losses(run, max_windows=8, control_seed=0)
    b = retrieval_losses(run, max_windows=8, control_seed=0, batch_size=3)
    c = retrieval_losses(run, max_windows=8, control_seed=1)
    for name, row in a["classes"].items():  # batching windows changes nothing
        assert row == pytest.approx(b["classes"][name], rel=1e-9)
    assert a["loss_mismatched"] != c["loss_mismatched"]
    assert a["loss_with"] == pytest.approx(c["loss_with"], rel=1e-12)


def test_answer_tokens_are_the_values_of_the_planted_facts(facts_run):
    from attnlab.eval.retrieval import retrieval_losses

    run, data_dir = facts_run
    res = retrieval_losses(run, max_windows=10)
    data = TokenData.open(data_dir)
    facts = json.loads((data_dir / "facts" / "facts.json").read_text())["facts"]
    answers = [
        (int(f), int(vs), int(ve))
        for f, _, vs, ve in load_statements(data_dir, "val")
        if vs >= 1 and ve <= 10 * 32  # targets of the 10 windows are val[1 : 321)
    ]
    assert answers and res["classes"]["answer"]["tokens"] == sum(ve - vs for _, vs, ve in answers)
    for f, vs, ve in answers:
        assert data.tokenizer.decode(list(data.val[vs:ve])) == facts[f]["value"]
    cls = res["classes"]
    assert cls["answer"]["tokens"] + cls["rest"]["tokens"] == cls["all"]["tokens"] == 320
    for cond in ("real", "mismatched", "none"):  # the classes split the token-weighted loss
        parts = sum(cls[c][cond] * cls[c]["tokens"] for c in ("answer", "rest"))
        assert parts / 320 == pytest.approx(cls["all"][cond], rel=1e-9)
        assert len(res["per_window"]["answer"][cond]) == 10


def test_eval_command_states_the_gain_as_real_vs_mismatched(facts_run, capsys):
    run, _ = facts_run
    assert main(["eval", str(run), "--tasks", "retrieval", "--limit", "8"]) == 0
    out = capsys.readouterr().out
    for row in ("loss, real neighbours", "loss, mismatched neighbours", "loss, none"):
        assert row in out
    assert "retrieval gain on answer: mismatched - real" in out and "paired over" in out
    stored = json.loads((run / "eval" / "results.json").read_text())["tasks"]["retrieval"]
    tests = stored["controls"]["tests"]
    assert (
        stored["metrics"]["answer/mismatched"]
        == stored["controls"]["classes"]["answer"]["mismatched"]
    )
    assert set(tests) == {"all", "answer", "rest", "key"}
    assert tests["all"]["windows"] == 8 and math.isfinite(tests["all"]["gain"])


def test_compare_report_has_the_three_rows(facts_run, tmp_path):
    from attnlab.experiments.reports.retrieval_controls import retrieval_section
    from attnlab.experiments.results import RunRow
    from attnlab.experiments.running.execute import evaluate_run
    from attnlab.experiments.spec import EvaluateSpec

    run, _ = facts_run
    plan = SimpleNamespace(run_dir=run, config=run_config(run), variant="retrieval", seed=0)
    (run / "eval" / "results.json").unlink(missing_ok=True)
    notes: list[str] = []
    evaluate_run(plan, EvaluateSpec(tasks=["retrieval"], limit=8), notes.append)  # as compare
    assert not (run / "eval" / "error.txt").exists(), notes
    row = RunRow("retrieval", 0, "finished", 1, 1, final_val_loss=3.0, run_dir=str(run))
    text = "\n".join(retrieval_section([row]))
    for label in ("real neighbours", "mismatched neighbours", "none"):
        assert f"| retrieval | {label} |" in text
    assert "mismatched - real" in text and "| retrieval | 0 | answer |" in text
    decoder = RunRow("decoder", 0, "finished", 1, 1, final_val_loss=3.0, run_dir=str(tmp_path))
    assert retrieval_section([decoder]) == []  # no retrieval results: no section


def test_eval_command_refuses_a_negative_control_seed(facts_run, capsys):
    run, _ = facts_run
    assert main(["eval", str(run), "--tasks", "retrieval", "--control-seed", "-1"]) == 2
    assert "--control-seed -1" in capsys.readouterr().err
