"""lm-evaluation-harness's own ``hf`` model on an exported folder scores like attnlab: the same
numbers as lm-eval's ``attnlab`` model on the run, and as attnlab's native evaluator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lm_eval import simple_evaluate
from lm_eval.tasks import TaskManager

import attnlab.eval.harness  # noqa: F401  (registers lm-eval's "attnlab" model)
from attnlab.eval import evaluate
from attnlab.eval.lm_eval_tasks import write_task_yamls
from attnlab.hf.export import export
from tests.helpers import paths
from tests.helpers.hf import fake_run

torch.set_num_threads(1)
FIXTURES = paths.FIXTURES / "eval"
TASKS = [
    "attnlab_arc_local",
    "attnlab_hellaswag_local",
    "attnlab_cloze_local",
    "attnlab_text_local",
]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm_eval")
    run = fake_run(root / "run", ["model.position.kind=rope", "model.query.kind=nonlinear"])
    folder = export(run, root / "hf").out
    tasks = write_task_yamls(
        root / "tasks",
        arc=FIXTURES / "arc.jsonl",
        hellaswag=FIXTURES / "hellaswag.jsonl",
        cloze=FIXTURES / "lambada.jsonl",
        text=FIXTURES / "texts.jsonl",
    )
    return run, folder, tasks


def _scores(results: dict) -> dict[str, dict[str, float]]:
    return {
        task: {k.split(",")[0]: v for k, v in r.items() if "," in k and "stderr" not in k}
        for task, r in results.items()
    }


def _lm_eval(model: str, args: str, tasks: Path) -> dict[str, dict[str, float]]:
    out = simple_evaluate(
        model=model,
        model_args=args,
        tasks=TASKS,
        task_manager=TaskManager(include_path=str(tasks), include_defaults=False),
        batch_size=2,
        device="cpu",
        bootstrap_iters=0,
        verbosity="ERROR",
    )
    return _scores(out["results"])


def test_lm_eval_hf_on_the_export_equals_attnlab(setup):
    run, folder, tasks = setup
    hf = _lm_eval("hf", f"pretrained={folder},trust_remote_code=True", tasks)
    ours = _lm_eval("attnlab", f"path={run}", tasks)
    assert hf.keys() == ours.keys() == set(TASKS)
    for task in TASKS:
        assert hf[task].keys() == ours[task].keys()
        for metric, value in ours[task].items():
            assert hf[task][metric] == pytest.approx(value, rel=1e-6), (task, metric)
    native = evaluate(
        run,
        [
            f"arc:{FIXTURES / 'arc.jsonl'}",
            f"hellaswag:{FIXTURES / 'hellaswag.jsonl'}",
            f"cloze:{FIXTURES / 'lambada.jsonl'}",
        ],
        device="cpu",
        save=False,
    )
    by_kind = {key.split(":")[0]: entry["metrics"] for key, entry in native.items()}
    for kind in ("arc", "hellaswag"):
        task = f"attnlab_{kind}_local"
        assert hf[task]["acc"] == pytest.approx(by_kind[kind]["acc"])
        assert hf[task]["acc_norm"] == pytest.approx(by_kind[kind]["acc_norm"])
    assert hf["attnlab_cloze_local"]["acc"] == pytest.approx(by_kind["cloze"]["acc"])
    # attnlab eval reads the export too (hf:DIR, registered classes, no remote code)
    (export_arc,) = evaluate(
        f"hf:{folder}", [f"arc:{FIXTURES / 'arc.jsonl'}"], device="cpu", save=False
    ).values()
    assert export_arc["metrics"]["acc"] == pytest.approx(by_kind["arc"]["acc"])
    assert export_arc["metrics"]["acc_norm"] == pytest.approx(by_kind["arc"]["acc_norm"])
    assert hf["attnlab_cloze_local"]["perplexity"] == pytest.approx(
        by_kind["cloze"]["perplexity"], rel=1e-5
    )


@pytest.mark.slow  # the stock CLI indexes all of lm-eval's built-in tasks (~15-70 s)
def test_stock_lm_eval_cli_runs_the_export(setup, tmp_path):
    """`lm_eval --model hf` needs no attnlab and no hook: the folder carries the model."""
    run, folder, tasks = setup
    cmd = [
        "lm_eval", "--model", "hf",
        "--model_args", f"pretrained={folder},trust_remote_code=True",
        "--tasks", "attnlab_arc_local", "--include_path", str(tasks),
        "--output_path", str(tmp_path / "out"), "--device", "cpu", "--batch_size", "2",
    ]  # fmt: skip
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    lm_eval = Path(sys.executable).parent / "lm_eval"
    cmd[0] = str(lm_eval) if lm_eval.exists() else cmd[0]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (result,) = list((tmp_path / "out").rglob("results_*.json"))
    got = json.loads(result.read_text())["results"]["attnlab_arc_local"]
    want = _lm_eval("attnlab", f"path={run}", tasks)["attnlab_arc_local"]
    assert got["acc,none"] == pytest.approx(want["acc"])
    assert got["acc_norm,none"] == pytest.approx(want["acc_norm"])
