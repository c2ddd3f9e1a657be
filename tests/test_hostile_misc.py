"""Issue 32, hostile inputs to retrieval, advice, ``inspect`` and ``--init-from``: each case
ends in a clear message naming the cause and the fix (no traceback), or in output that is true."""

from __future__ import annotations

import json
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from attnlab.cli import main
from data_helpers import WORDS, prepare_bytes, word_corpus


# ------------------------------------------------------------------------------ retrieval
@pytest.fixture(scope="module")
def one_document(tmp_path_factory) -> Path:
    """Data whose training split is one document (and validation another), with its database
    of k=2 neighbours built."""
    root = tmp_path_factory.mktemp("one-doc")
    corpus = word_corpus(root / "corpus.jsonl", WORDS, n_docs=2, length=300, seed=1)
    data = prepare_bytes(corpus, root / "prepared", val_fraction=0.5)
    assert [
        s["documents"] for s in json.loads((data / "meta.json").read_text())["splits"].values()
    ] == [1, 1]
    from attnlab.data.retrieval import build_database

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the warning is the test's, below
        build_database(data, chunk_size=16, neighbours=2, workers=1)
    return data


def _retrieval(data: Path, *extra: str) -> int:
    return main(["data", "retrieval", "--data", str(data), "--workers", "1", *extra])


def test_a_one_document_training_split_warns_that_its_chunks_have_no_neighbours(
    one_document, capsys
):
    """Every training chunk shares the one document with every database chunk, so RETRO's
    no-leakage rule leaves it no neighbour: said, with the rule and the numbers, not "k=2"."""
    assert _retrieval(one_document) == 0
    cap = capsys.readouterr()
    train = np.load(one_document / "retrieval" / "m16-k2-c16" / "train.npy")
    assert (train < 0).all()  # the premise: no training chunk has a neighbour
    n = len(train)
    assert f"fewer for {n:,} train chunks" in cap.out
    warning = cap.err
    assert "warning:" in warning and f"{n:,} of {n:,} train chunks" in warning
    assert f"({n:,} have none)" in warning
    assert "no-leakage rule" in warning and "holds 1 document," in warning
    assert f"{n:,} of the {n:,} database chunks" in warning  # what the rule excluded
    assert "val chunks have fewer" not in warning  # validation retrieves from all of train


def _copy_database(one_document: Path, tmp_path: Path) -> tuple[Path, Path]:
    data = tmp_path / "data"
    shutil.copytree(one_document, data)
    return data, data / "retrieval" / "m16-k2-c16"


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:100])


DAMAGE = {
    "meta-a-string": ("meta.json", lambda p: p.write_text('"a string"'), "a JSON string"),
    "meta-a-list": ("meta.json", lambda p: p.write_text("[1, 2]"), "a JSON list"),
    "meta-no-settings": (
        "meta.json",
        lambda p: p.write_text('{"format": "attnlab-retrieval", "version": 1}'),
        "no valid 'chunk_size'",
    ),
    "meta-a-directory": (
        "meta.json",
        lambda p: (p.unlink(), p.mkdir()),
        "is a directory, not a file",
    ),
    "npy-truncated": ("train.npy", _truncate, "cannot be read as a NumPy array"),
    "npy-other-shape": (
        "val.npy",
        lambda p: np.save(p, np.zeros((3, 5))),
        "holds float64 [3, 5], not int64",
    ),
}


@pytest.mark.parametrize("case", DAMAGE)
def test_a_damaged_database_file_is_named_with_the_command_that_rebuilds_it(
    one_document, tmp_path, capsys, case
):
    name, damage, said = DAMAGE[case]
    data, db = _copy_database(one_document, tmp_path)
    damage(db / name)
    assert _retrieval(data) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"{db / name}" in err and said in err
    fix = f"attnlab data retrieval --data {data} --chunk-size 16 --neighbours 2 --continuation 16 --restart"
    assert fix in err
    # the advice works: that command rebuilds the database
    assert main([*fix.split()[1:], "--workers", "1"]) == 0
    capsys.readouterr()
    assert _retrieval(data) == 0


def test_live_retrieval_without_bm25s_names_the_extra(one_document, monkeypatch):
    """``attnlab generate`` of a retrieval run scores each chunk with bm25s: when it is not
    installed, the [retrieval] extra's install line, not a ModuleNotFoundError."""
    from attnlab.base.errors import UserError
    from attnlab.data import TokenData
    from attnlab.data.retrieval import Database

    db = Database.open(one_document / "retrieval" / "m16-k2-c16")
    monkeypatch.setitem(sys.modules, "bm25s", None)  # as if not installed
    with pytest.raises(UserError, match=r"pip install 'attnlab\[retrieval\]'.*") as e:
        db.retriever(TokenData.open(one_document))
    assert "--no-retrieval" in str(e.value)


def test_generate_of_a_retrieval_run_without_bm25s_names_the_extra(
    one_document, tmp_path, monkeypatch, capsys
):
    from attnlab.train import train
    from data_helpers import tiny_run_config

    cfg = tiny_run_config(
        one_document,
        "model.family=retrieval",
        "model.retrieval.chunk_size=16",
        steps=2,
        eval_every=2,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train(cfg, tmp_path / "run")
    monkeypatch.setitem(sys.modules, "bm25s", None)  # as if not installed
    argv = ["generate", str(tmp_path / "run"), "--prompt", "the", "--max-new-tokens", "3"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "pip install 'attnlab[retrieval]'" in err
    assert "--no-retrieval" in err
    assert main([*argv, "--no-retrieval"]) == 0  # the way around it works
