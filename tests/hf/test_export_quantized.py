"""A quantized directory exports so that transformers loads it quantized (torchao tensors from
its safetensors, ``quantization_config`` in config.json), ``export --verify`` passes at the
scheme's tolerance, and ``lm_eval --model hf`` scores the export as lm-eval's ``attnlab`` model
scores the quantized directory (issue 35)."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

pytest.importorskip("torchao")
pytest.importorskip("lm_eval")

import attnlab.eval.harness
import attnlab.quant.target  # noqa: F401  (quantized directories as targets)
from attnlab.eval.lm_eval_tasks import write_task_yamls
from attnlab.hf.export import export
from attnlab.hf.verify import check_exports
from attnlab.quant.run import quantize_run
from attnlab.quant.schemes import get_scheme
from attnlab.quant.store import load
from tests.helpers.hf import fake_run, python_without_attnlab
from tests.helpers.paths import FIXTURES as ALL_FIXTURES

torch.set_num_threads(1)
FIXTURES = ALL_FIXTURES / "eval"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("qexport")
    run = fake_run(root / "run", ["model.position.kind=rope"])
    out = {}
    for scheme in ("int8-weight", "int8-dynamic"):
        qdir = root / scheme
        quantize_run(run, scheme, qdir)
        out[scheme] = (qdir, export(qdir, root / f"hf-{scheme}").out)
    return root, out


def test_transformers_loads_the_export_quantized_without_attnlab(exported):
    _, out = exported
    qdir, folder = out["int8-weight"]
    config = json.loads((folder / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "torchao"
    assert config["quantization_config"]["modules_to_not_convert"] == ["model.lm_head"]
    code = f"""
import torch
from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained({str(folder)!r}, trust_remote_code=True)
w = m.model.decoder.blocks[0].ffn.w_in.weight
print(type(w).__name__, w.qdata.dtype)
ids = torch.arange(12).view(1, 12)
torch.save(m(ids).logits, {str(folder / "logits.pt")!r})
"""
    p = subprocess.run(python_without_attnlab(code), capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == ["Int8Tensor", "torch.int8"]
    got = torch.load(folder / "logits.pt", weights_only=True)
    (folder / "logits.pt").unlink()
    with torch.no_grad():
        ref = load(qdir).model(torch.arange(12).view(1, 12)).logits
    assert torch.allclose(got, ref, atol=1e-5)


@pytest.mark.parametrize("scheme", ["int8-weight", "int8-dynamic"])
def test_export_verify_passes_at_the_schemes_tolerance(exported, scheme):
    _, out = exported
    qdir, folder = out[scheme]
    q = load(qdir)
    tol = get_scheme(scheme).verify_tolerance
    (check,) = check_exports([(folder, q.model, q.tokenizer)], pipeline=False, tolerance=tol)
    assert check.passed, check.sentence()
    assert check.max_abs_logits < tol


def test_int4_export_is_refused_with_the_reason(exported, tmp_path):
    from attnlab.base.errors import UserError

    root, _ = exported
    qdir = root / "int4"
    quantize_run(root / "run", "int4-weight", qdir, group_size=32)
    with pytest.raises(UserError, match="no safetensors form"):
        export(qdir, tmp_path / "hf4")


def test_lm_eval_hf_scores_the_quantized_export_as_attnlab_scores_the_directory(exported):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    root, out = exported
    qdir, folder = out["int8-weight"]
    tasks = write_task_yamls(
        root / "tasks", cloze=FIXTURES / "lambada.jsonl", text=FIXTURES / "texts.jsonl"
    )

    def score(model: str, args: str) -> dict:
        r = simple_evaluate(
            model=model,
            model_args=args,
            tasks=["attnlab_cloze_local", "attnlab_text_local"],
            task_manager=TaskManager(include_path=str(tasks), include_defaults=False),
            batch_size=2,
            device="cpu",
            bootstrap_iters=0,
            limit=6,
            verbosity="ERROR",
        )["results"]
        return {
            t: {k: v for k, v in m.items() if "," in k and "stderr" not in k} for t, m in r.items()
        }

    hf = score("hf", f"pretrained={folder},trust_remote_code=True")
    ours = score("attnlab", f"path={qdir}")
    assert hf.keys() == ours.keys()
    for task in ours:
        for metric, value in ours[task].items():
            assert hf[task][metric] == pytest.approx(value, rel=1e-5), (task, metric)
