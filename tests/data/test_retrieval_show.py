"""Issue 36: ``attnlab data retrieval --show RUN_OR_DATA --index N`` prints a chunk and its
neighbours as the data's tokenizer decodes them, with their documents; bad input is one line."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("faiss")

from attnlab.cli import main
from attnlab.data import TokenData
from attnlab.data.retrieval import RetrievalWarning, build_database
from attnlab.data.retrieval_index import index_spec
from attnlab.data.synth_facts import FactsSpec, generate


@pytest.fixture(scope="module")
def facts(tmp_path_factory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("show") / "data"
    generate(out, FactsSpec(facts=30), tokenizer="gpt2")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RetrievalWarning)
        db = build_database(
            out, chunk_size=16, neighbours=2, workers=1, index=index_spec("hnsw", "random")
        )
    return out, db.directory


def test_show_prints_the_chunk_and_its_neighbours_as_text(facts, capsys):
    data_dir, db_dir = facts
    assert main(["data", "retrieval", "--show", str(data_dir), "--index", "5"]) == 0
    out = capsys.readouterr().out
    data = TokenData.open(data_dir)
    tok = data.tokenizer
    chunk = tok.decode([int(t) for t in data.val[80:96]])
    assert f"val chunk 5 of {len(data.val) // 16:,}: tokens 80-95" in out
    assert json.dumps(chunk, ensure_ascii=False) in out
    idx = np.load(db_dir / "val.npy")[5]
    for i, j in enumerate(idx, 1):
        text = tok.decode([int(t) for t in data.train[j * 16 : j * 16 + 16]])
        assert f"neighbour {i}: database chunk {j:,}" in out
        assert json.dumps(text, ensure_ascii=False) in out


def test_show_a_training_chunk_of_a_run(facts, tmp_path, capsys):
    """A run directory names its database in status.json; a training chunk's readers' documents
    are printed, and no neighbour comes from them."""
    _, db_dir = facts
    run = tmp_path / "run"
    run.mkdir()
    rec = {"retrieval_database": {"directory": str(db_dir)}}
    (run / "status.json").write_text(json.dumps(rec))
    assert main(["data", "retrieval", "--show", str(run), "--index", "3", "--split", "train"]) == 0
    out = capsys.readouterr().out
    assert "train chunk 3 of" in out and "read by  tokens 63-79" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--index", "999999"], "the val split has chunks 0.."),
        ([], "--show needs --index N"),
        (["--index", "1", "--split", "test"], "use train or val"),
    ],
)
def test_bad_show_input_is_one_line(facts, capsys, args, message):
    data_dir, _ = facts
    assert main(["data", "retrieval", "--show", str(data_dir), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_show_needs_a_database(tmp_path, capsys):
    assert main(["data", "retrieval", "--show", str(tmp_path), "--index", "0"]) == 2
    assert "neither a retrieval run, a database" in capsys.readouterr().err
    assert main(["data", "retrieval"]) == 2
    assert "give --data DIR" in capsys.readouterr().err
