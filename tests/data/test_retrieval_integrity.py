"""Issue 36, a retrieval database checked against its recorded hashes and its data: every file
hashed once then trusted by its stamp, and each kind of change refused with the rebuild
command (a changed neighbour file, a missing index file, data prepared again)."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("bm25s")
pytest.importorskip("faiss")

from attnlab.data import TokenData
from attnlab.data.retrieval import RetrievalWarning, build_database
from attnlab.data.retrieval_index import index_spec
from attnlab.data.retrieval_index.integrity import (
    CACHE,
    DatabaseIntegrityError,
    verify_database,
)
from tests.helpers.data import WORDS, prepare_bytes, word_corpus


@pytest.fixture
def built(tmp_path) -> tuple[Path, Path]:
    corpus = word_corpus(tmp_path / "c.jsonl", WORDS, n_docs=40, length=(30, 60), seed=2)
    data = prepare_bytes(corpus, tmp_path / "data")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RetrievalWarning)
        db = build_database(
            data, chunk_size=16, neighbours=2, workers=1, index=index_spec("bm25", "unigrams")
        )
    return data, db.directory


def test_a_fresh_database_passes_and_is_hashed_once(built, monkeypatch):
    data, db_dir = built
    db = verify_database(db_dir, TokenData.open(data))
    assert db.directory == db_dir
    cache = json.loads((db_dir / CACHE).read_text())
    assert set(cache) == set(db.meta["files"]) and "bm25/data.csc.index.npy" in cache
    import attnlab.data.retrieval_index.integrity as integrity

    hashed = []
    monkeypatch.setattr(integrity, "sha256_file", lambda p: hashed.append(p) or "x")
    verify_database(db_dir, TokenData.open(data))
    assert hashed == []  # the stamps match: one stat per file, no hashing


def test_a_changed_neighbour_file_is_refused_with_the_rebuild_command(built):
    data, db_dir = built
    verify_database(db_dir, TokenData.open(data))  # cached as good
    path = db_dir / "train.npy"
    arr = np.load(path)
    arr[:] = 0  # zeroed neighbours, same size and shape (the experiment)
    st = path.stat()
    np.save(path, arr)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # the mtime put back
    with pytest.raises(DatabaseIntegrityError, match=r"train\.npy does not match the sha256") as e:
        verify_database(db_dir, TokenData.open(data))
    assert "attnlab data retrieval --data" in str(e.value) and "--kind bm25" in str(e.value)
    assert "--encoder unigrams --restart" in str(e.value)


def test_a_missing_index_file_is_refused(built):
    data, db_dir = built
    (db_dir / "bm25" / "data.csc.index.npy").unlink()
    with pytest.raises(DatabaseIntegrityError, match=r"data\.csc\.index\.npy is missing"):
        verify_database(db_dir, TokenData.open(data))


def test_data_prepared_again_is_refused_by_its_content_hash(built, tmp_path):
    data, db_dir = built
    other = word_corpus(tmp_path / "other.jsonl", WORDS, n_docs=40, length=(30, 60), seed=3)
    shutil.move(str(db_dir.parent), str(tmp_path / "keep"))
    shutil.rmtree(data)
    prepare_bytes(other, data)
    shutil.move(str(tmp_path / "keep"), str(data / "retrieval"))
    with pytest.raises(DatabaseIntegrityError, match="built from data with content hash") as e:
        verify_database(db_dir, TokenData.open(data))
    assert "--restart" in str(e.value)
