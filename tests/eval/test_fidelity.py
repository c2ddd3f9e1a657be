"""attnlab's numbers equal lm-evaluation-harness's, item by item, on files it has never seen.

Three routes score the same items: lm-eval's own ``hf`` model on an exported folder, lm-eval with
attnlab's ``attnlab`` model on the run, and ``attnlab eval`` (``mc:`` / ``hellaswag:``). The
generic fixture has double spaces, bracketed text, a trailing space, a long ending and an item
longer than the context (its context cut from the left); the HellaSwag fixture is in the
official format with WikiHow markers, scored by lm-eval's own ``hellaswag`` ``process_docs``.
The model is trained until its tokens depend on the prompt, so a wrong text shows in the scores.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import lm_eval
import pytest
import torch
from lm_eval import simple_evaluate
from lm_eval.tasks import TaskManager

import attnlab.eval.harness  # noqa: F401  (registers lm-eval's "attnlab" model)
from attnlab.cli import main
from attnlab.eval import evaluate, load_language_model
from attnlab.eval.evaluate import TasksFailedError
from attnlab.eval.lm_eval_tasks import write_task_yamls
from attnlab.eval.multiple_choice import evaluate_multiple_choice, load_mc_file
from attnlab.eval.scoring import encode_pair
from attnlab.hf.export import export
from tests.helpers import paths
from tests.helpers.hf import alternation_run

torch.set_num_threads(1)
FIXTURES = paths.FIXTURES / "eval"
MC = FIXTURES / "mc.jsonl"
HELLASWAG = FIXTURES / "hellaswag_official.jsonl"
OVERLONG = FIXTURES / "mc_overlong.jsonl"

#: lm-eval's own hellaswag task, reading a local file (its utils.py is copied beside it)
HELLASWAG_YAML = """task: lm_eval_hellaswag_local
dataset_path: json
dataset_kwargs:
  data_files:
    validation: {path}
output_type: multiple_choice
validation_split: validation
process_docs: !function utils.process_docs
doc_to_text: "{{{{query}}}}"
doc_to_target: "{{{{label}}}}"
doc_to_choice: "choices"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("fidelity")
    run = alternation_run(root / "run")
    folder = export(run, root / "hf").out
    tasks = write_task_yamls(root / "tasks", mc=MC)
    shutil.copyfile(
        Path(lm_eval.__file__).parent / "tasks" / "hellaswag" / "utils.py", tasks / "utils.py"
    )
    (tasks / "lm_eval_hellaswag.yaml").write_text(HELLASWAG_YAML.format(path=HELLASWAG.resolve()))
    return run, folder, tasks


def _lm_eval(model: str, args: str, tasks: Path, names: list[str]) -> dict:
    return simple_evaluate(
        model=model,
        model_args=args,
        tasks=names,
        task_manager=TaskManager(include_path=str(tasks), include_defaults=False),
        batch_size=3,
        device="cpu",
        bootstrap_iters=0,
        log_samples=True,
        verbosity="ERROR",
    )


def _per_item(out: dict, task: str) -> list[list[float]]:
    samples = sorted(out["samples"][task], key=lambda s: s["doc_id"])
    return [[float(r[0]) for r in s["filtered_resps"]] for s in samples]


def _metrics(out: dict, task: str) -> dict[str, float]:
    r = out["results"][task]
    return {k.split(",")[0]: v for k, v in r.items() if "," in k and "stderr" not in k}


NAMES = ["attnlab_mc_local", "lm_eval_hellaswag_local"]


@pytest.fixture(scope="module")
def three_routes(setup):
    run, folder, tasks = setup
    hf = _lm_eval("hf", f"pretrained={folder},trust_remote_code=True", tasks, NAMES)
    ours = _lm_eval("attnlab", f"path={run}", tasks, NAMES)
    lm = load_language_model(run, device="cpu")
    native = {
        "attnlab_mc_local": evaluate_multiple_choice(lm, load_mc_file("mc", MC), batch_size=3),
        "lm_eval_hellaswag_local": evaluate_multiple_choice(
            lm, load_mc_file("hellaswag", HELLASWAG), batch_size=3
        ),
    }
    eval_api = evaluate(run, [f"mc:{MC}", f"hellaswag:{HELLASWAG}"], device="cpu", save=False)
    return hf, ours, native, eval_api


@pytest.mark.parametrize("task", NAMES)
def test_per_item_loglikelihoods_agree(three_routes, task):
    hf, ours, native, _ = three_routes
    want = _per_item(hf, task)
    assert len(want) == len(native[task].items)
    # the same model through lm-eval's two adapters: equal to float32 rounding (the batches'
    # padded shapes differ, and with more than one thread the kernels' sums may be split
    # differently: 1.5e-5 on a log-likelihood of -164 was seen with 2 threads)
    for got_item, want_item in zip(_per_item(ours, task), want):
        assert got_item == pytest.approx(want_item, rel=1e-6, abs=1e-6)
    for got_item, want_item in zip(native[task].logprobs, want):
        assert got_item == pytest.approx(want_item, rel=1e-6, abs=1e-5)
    # the items differ: a wrong text would move the scores visibly
    assert len({round(v, 3) for item in want for v in item}) > len(want)


@pytest.mark.parametrize(
    ("task", "key"), [(NAMES[0], "mc:mc"), (NAMES[1], "hellaswag:hellaswag_official")]
)
def test_every_metric_agrees(three_routes, task, key):
    hf, ours, native, eval_api = three_routes
    assert _metrics(ours, task) == _metrics(hf, task)
    metrics = eval_api[key]["metrics"]
    assert set(_metrics(hf, task)) == {"acc", "acc_norm"}
    for name, value in _metrics(hf, task).items():
        assert metrics[name] == pytest.approx(value), name
        assert native[task].metrics()[name] == pytest.approx(value), name
    samples = sorted(hf["samples"][task], key=lambda s: s["doc_id"])
    assert [r["acc"] for r in native[task].per_item()] == [s["acc"] for s in samples]
    assert [r["acc_norm"] for r in native[task].per_item()] == [s["acc_norm"] for s in samples]


def test_mc_takes_the_text_as_it_is_and_hellaswag_cleans_it():
    (double,) = load_mc_file("mc", MC, limit=1)
    assert "  table" in double.context
    assert load_mc_file("mc", MC)[7].choices[0] == "arrived at dusk.  "
    cleaned = load_mc_file("hellaswag", HELLASWAG)[0]
    assert cleaned.context.startswith("Baking cookies:. How to bake cookies Preheat")
    assert "[" not in cleaned.context and "  " not in cleaned.choices[1]


def test_an_overlong_item_is_named_and_the_other_tasks_scored(setup, tmp_path, capsys):
    run, _, _ = setup
    tasks = [f"mc:{OVERLONG}", f"mc:{MC}"]
    with pytest.raises(TasksFailedError) as info:
        evaluate(run, tasks, device="cpu", save=False)
    assert list(info.value.results) == ["mc:mc"]
    (message,) = info.value.failures.values()
    assert f"task 'mc:{OVERLONG}'" in message
    assert "item 2 (0-based), choice 0" in message and "131 tokens" in message
    assert "128 tokens" in message
    out = tmp_path / "results.json"
    code = main(["eval", str(run), "--tasks", ",".join(tasks), "--no-progress", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 2
    assert "item 2 (0-based), choice 0" in captured.err and "Traceback" not in captured.err
    assert "mc:mc" in captured.out and "mc:mc" in out.read_text()


def test_lm_eval_route_scores_an_overlong_item_cut_from_the_left(setup, tmp_path, caplog):
    """lm-eval asks for every task's requests in one call, so a refusal would stop them all:
    the over-long continuation is scored on its last max_length tokens (as lm-eval cuts a
    context from the left), one warning counts it and names its document, and the other task
    of the same call is scored too."""
    run, _, _ = setup
    tasks = write_task_yamls(tmp_path / "tasks", mc=OVERLONG, cloze=FIXTURES / "lambada.jsonl")
    with caplog.at_level("WARNING", logger="attnlab.eval.harness"):
        out = _lm_eval("attnlab", f"path={run}", tasks, ["attnlab_mc_local", "attnlab_cloze_local"])
    assert len(out["samples"]["attnlab_mc_local"]) == len(load_mc_file("mc", OVERLONG))
    assert out["results"]["attnlab_cloze_local"]["acc,none"] >= 0
    (warning,) = [r.getMessage() for r in caplog.records if "longer than" in r.getMessage()]
    assert warning.startswith("1 request(s)") and "task 'attnlab_mc_local', doc_id 2" in warning
    lm = load_language_model(run, device="cpu")
    item = load_mc_file("mc", OVERLONG)[2]
    _, cont = encode_pair(lm, item.context, " " + item.choices[0])
    window = torch.tensor([cont[-(lm.max_length + 1) :]])
    with torch.no_grad():
        logp = lm.logits(window[:, :-1]).double().log_softmax(-1)[0]
    want = float(logp.gather(-1, window[0, 1:, None]).sum())
    doc2 = next(s for s in out["samples"]["attnlab_mc_local"] if s["doc_id"] == 2)
    assert float(doc2["resps"][0][0][0]) == pytest.approx(want, abs=1e-4)


def test_attnlab_lm_eval_exits_2_with_one_line(tmp_path, monkeypatch, capsys):
    """The CLI's own evaluation stands in for lm-eval's argument parsing (which indexes every
    built-in task, ~15-70 s): the real error, through ``attnlab-lm-eval``'s ``main``."""
    import lm_eval.__main__

    from attnlab.eval import lm_eval_cli

    tasks = write_task_yamls(tmp_path / "tasks", mc=MC)

    def cli_evaluate() -> None:
        _lm_eval("attnlab", f"path={tmp_path / 'no-such-run'}", tasks, ["attnlab_mc_local"])

    monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", cli_evaluate)
    with pytest.raises(SystemExit) as info:
        lm_eval_cli.main()
    err = capsys.readouterr().err
    assert info.value.code == 2
    last = err.strip().splitlines()[-1]  # after lm-eval's progress bars
    assert last.startswith("attnlab-lm-eval: error:") and "no-such-run" in last
    assert "Traceback" not in err
