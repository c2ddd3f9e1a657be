"""The model card of an export: the run's evaluation results (a table and the Hub's model-index),
the corpus's license and datasets from its own metadata, a readable attribution with the full
list in a file, and loading lines that run as written."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
import torch
from huggingface_hub import ModelCard

from attnlab.data import prepare
from attnlab.eval import evaluate
from attnlab.hf.card import COUNTS, hub_license
from attnlab.hf.export import export
from tests.helpers import paths
from tests.helpers.hf import fake_run, python_without_attnlab

torch.set_num_threads(1)
FIXTURES = paths.FIXTURES / "eval"


@pytest.fixture(scope="module")
def card(tmp_path_factory):
    pytest.importorskip("gensim")  # the wiki-sample corpus (the [offline] extra)
    root = tmp_path_factory.mktemp("card")
    data = root / "wiki"
    prepare("wiki-sample", "bytes", data, progress=False)
    run = fake_run(root / "run", [f"data.dir={data}"])
    results = evaluate(run, [f"mc:{FIXTURES / 'mc.jsonl'}", f"cloze:{FIXTURES / 'lambada.jsonl'}"])
    folder = export(run, root / "export").out
    text = (folder / "README.md").read_text(encoding="utf-8")
    header = ModelCard.load(folder / "README.md").data  # the Hub's own reader
    return folder, text, header, results


def test_card_carries_the_runs_results_as_table_and_model_index(card):
    _, text, header, results = card
    assert set(results) == {"mc:mc", "cloze:lambada"}
    assert header.model_name == "export"
    got: dict[str, dict[str, float]] = {}
    for r in header.eval_results:
        got.setdefault(r.dataset_name, {})[r.metric_type] = r.metric_value
    assert set(got) == set(results)
    for task, entry in results.items():
        want = {
            k: v
            for k, v in entry["metrics"].items()
            if k not in COUNTS and not k.endswith("_stderr")
        }
        assert got[task] == pytest.approx(want)
        acc = entry["metrics"]["acc"]
        assert re.search(rf"\| {re.escape(task)} \| .* \| acc \| {acc:.4f} \|", text)


def test_card_license_datasets_and_a_readable_attribution(card):
    folder, text, header, _ = card
    assert header.license == "cc-by-sa-3.0"
    assert header.datasets == ["wiki-sample"]
    assert "- license: CC BY-SA 3.0" in text and "- articles: 100" in text
    assert "{'source'" not in text  # no raw Python dict
    full = json.loads((folder / "data_attribution.json").read_text(encoding="utf-8"))
    assert len(full["articles"]) == full["n_articles"] == 100
    assert full["articles"][0] not in text  # the titles live in the file, not the card


def test_card_code_runs_as_written_without_attnlab(card):
    """In a fresh process where attnlab cannot be imported, from the folder's parent, with no
    terminal to answer transformers' trust_remote_code question."""
    folder, text, _, _ = card
    (code,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    proc = subprocess.run(
        python_without_attnlab(code),
        cwd=folder.parent,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("The")


@pytest.mark.fast
def test_hub_license_from_corpus_metadata():
    assert hub_license({"license": "CC0 1.0 (as released)"}) == ("cc0-1.0", None)
    assert hub_license({"license": "PSF License"}) == ("other", "PSF License")
    assert hub_license(None) == ("unknown", None)
