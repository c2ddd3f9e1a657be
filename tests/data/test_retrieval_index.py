"""Issue 36, the retrieval indices that scale: BM25 over words/unigrams on bm25s' index with a
bounded search (against a float64 BM25 written here, exact and bounded), sharded faiss HNSW over
a random-projection encoder (against exact search), byte-identical builds for 1 and 2 workers,
resumable after SIGKILL, the stored index queried live, planted facts retrieved, and the
format-1 database still loading."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("bm25s")
pytest.importorskip("faiss")

from attnlab.cli import main
from attnlab.data import TokenData
from attnlab.data.retrieval import Database, RetrievalWarning, build_database, database_dir
from attnlab.data.retrieval_index import index_spec
from attnlab.data.retrieval_index import terms as T
from attnlab.data.retrieval_index.fact_recall import fact_recall
from attnlab.data.synth_facts import FactsSpec, generate, load_statements

KINDS = [("bm25", "words"), ("bm25", "unigrams"), ("hnsw", "random")]
FILES = ("train.npy", "val.npy", "meta.json")


@pytest.fixture(scope="module")
def facts(tmp_path_factory) -> Path:
    """A planted-fact corpus of 60 facts, byte tokens (about 2,300 chunks of 16)."""
    out = tmp_path_factory.mktemp("facts") / "data"
    generate(out, FactsSpec(facts=60))
    return out


def _build(data: Path, kind: str, enc: str, spec: dict | None = None, **kw) -> Database:
    index = index_spec(kind, enc).model_copy(update=spec or {})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RetrievalWarning)
        return build_database(data, chunk_size=16, neighbours=2, index=index, **kw)


@pytest.mark.parametrize(("kind", "enc"), KINDS)
def test_same_bytes_for_one_and_two_workers(facts, kind, enc):
    one = _build(facts, kind, enc, workers=1, restart=True)
    files = {f: (one.directory / f).read_bytes() for f in [*FILES, *one.meta["index_files"]]}
    two = _build(facts, kind, enc, workers=2, restart=True)
    assert {f: (two.directory / f).read_bytes() for f in files} == files
    assert one.directory.name == f"m16-k2-c16-{kind}-{enc}"
    meta = json.loads(files["meta.json"])
    assert meta["index"]["kind"] == kind and meta["index"]["encoder"] == enc
    assert meta["leakage"] == "reading-tokens" and meta["version"] == 2


def _bm25_reference(docs: list[list[int]], query: list[int]) -> np.ndarray:
    """BM25 (lucene: idf = ln(1 + (N - df + .5) / (df + .5)), k1 = 1.5, b = 0.75) in float64."""
    n = len(docs)
    df = Counter(t for d in docs for t in set(d))
    avg = sum(map(len, docs)) / n
    out = np.zeros(n)
    for j, d in enumerate(docs):
        tf = Counter(d)
        for t in query:
            if t in tf:
                idf = math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
                out[j] += idf * tf[t] / (tf[t] + 1.5 * (1 - 0.75 + 0.75 * len(d) / avg))
    return out


UNBOUNDED = {"query_terms": 10**6, "postings": 10**9}


@pytest.mark.parametrize("enc", ["words", "unigrams"])
def test_bm25_neighbours_are_the_top_scores_of_a_float64_bm25(facts, enc):
    """With bounds that do not bind, every validation chunk's neighbours are its two best chunks
    by an independent BM25."""
    db = _build(facts, "bm25", enc, UNBOUNDED, workers=1, restart=True)
    data = TokenData.open(facts)
    decode = data.tokenizer.decode if enc == "words" else None
    ids, vocab = T.term_ids(np.asarray(data.train), 16, decode)
    queries = T.query_ids(np.asarray(data.val), 16, decode, vocab)
    rng = np.random.default_rng(0)
    for q in rng.choice(len(queries), 40, replace=False):
        ref = _bm25_reference(ids, queries[q])
        got = np.asarray(db.val)[q]
        best = np.sort(ref)[::-1][:2]
        assert np.allclose(np.sort(ref[got])[::-1], best, rtol=1e-4), q
    _build(facts, "bm25", enc, workers=1, restart=True)  # the default bounds, for the others


def _bounded_reference(docs: list[list[int]], query: list[int], terms: int, postings: int):
    """BM25 restricted as the bounded search says: the query's ``terms`` distinct terms of
    lowest df (ties to the lower id), each scoring only its ``postings`` best chunks."""
    df = Counter(t for d in docs for t in set(d))
    kept = sorted(set(query), key=lambda t: (df[t], t))[:terms]
    out = np.zeros(len(docs))
    for t in kept:
        per = _bm25_reference(docs, [t])
        best = np.lexsort((np.arange(len(docs)), -per))[:postings]
        best = best[per[best] > 0]
        out[best] += per[best] * query.count(t)
    return out


def test_bounded_bm25_scores_only_the_kept_terms_and_postings(facts, monkeypatch):
    """With 2 query terms and 5 postings per term, a query touches at most 10 postings, and its
    neighbours are the best chunks of the bounded BM25 written above (not of the full one)."""
    from attnlab.data.retrieval_index import impact

    touched = []
    orig = impact._gather

    def gather(index, qid, term, counts):
        got = orig(index, qid, term, counts)
        touched.append(np.bincount(got[0]).max(initial=0))
        return got

    monkeypatch.setattr(impact, "_gather", gather)
    db = _build(facts, "bm25", "words", {"query_terms": 2, "postings": 5}, workers=1, restart=True)
    assert touched and max(touched) <= 10
    data = TokenData.open(facts)
    ids, vocab = T.term_ids(np.asarray(data.train), 16, data.tokenizer.decode)
    queries = T.query_ids(np.asarray(data.val), 16, data.tokenizer.decode, vocab)
    differs = 0
    for q in np.random.default_rng(1).choice(len(queries), 25, replace=False):
        ref = _bounded_reference(ids, queries[q], 2, 5)
        got = np.asarray(db.val)[q]
        want = np.sort(ref[ref > 0])[::-1][:2]
        assert np.allclose(np.sort(ref[got[got >= 0]])[::-1], want, rtol=1e-4), q
        differs += not np.allclose(want, np.sort(_bm25_reference(ids, queries[q]))[::-1][:2])
    assert differs > 0  # the bounds bind on this data: the full BM25 ranks otherwise
    _build(facts, "bm25", "words", workers=1, restart=True)


def test_hnsw_finds_the_exact_nearest_neighbours(facts):
    """HNSW's validation neighbours are the exact inner-product best (recall >= 0.95)."""
    from attnlab.data.retrieval_index.encoders import RandomProjection, idf_weights

    db = _build(facts, "hnsw", "random", workers=1)
    data = TokenData.open(facts)
    train, val = np.asarray(data.train), np.asarray(data.val)
    enc = RandomProjection(idf_weights(train, 16, data.vocab_size), 128)
    x = enc(train[: len(train) // 16 * 16].reshape(-1, 16))
    q = enc(val[: len(val) // 16 * 16].reshape(-1, 16))
    exact = np.argsort(-(q @ x.T), axis=1, kind="stable")[:, :2]
    got = np.asarray(db.val)
    recall = np.mean([len(set(a) & set(b)) / 2 for a, b in zip(got, exact, strict=True)])
    assert recall >= 0.95


@pytest.mark.parametrize(("kind", "enc"), [("bm25", "words"), ("hnsw", "random")])
def test_resumes_after_sigkill_with_the_same_bytes(facts, tmp_path, kind, enc, monkeypatch):
    """A build killed after its index and some query blocks resumes from them: same bytes."""
    import attnlab.data.retrieval_index.build as B

    monkeypatch.setattr(B, "BLOCK", 256)
    whole = _build(facts, kind, enc, workers=1, restart=True)
    files = {f: (whole.directory / f).read_bytes() for f in [*FILES, *whole.meta["index_files"]]}
    out = whole.directory
    partial = out.parent / f".{out.name}.partial"
    code = (
        "import os, signal, attnlab.data.retrieval_index.build as B, attnlab.data.retrieval as r\n"
        "from attnlab.data.retrieval_index import index_spec\n"
        "B.BLOCK = 256\n"
        "orig = B._save_npy\n"
        "def save(path, arr):\n"
        "    orig(path, arr)\n"
        "    if path.name.startswith('train-000002'): os.kill(os.getpid(), signal.SIGKILL)\n"
        "B._save_npy = save\n"
        f"r.build_database({str(facts)!r}, chunk_size=16, neighbours=2, workers=1, restart=True,"
        f" index=index_spec({kind!r}, {enc!r}))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "4242"}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, env=env)
    assert p.returncode == -signal.SIGKILL, p.stderr.decode()[-2000:]
    assert not out.exists() and (partial / "train-000002.npy").exists()
    kept = {x.name: x.stat().st_mtime_ns for x in partial.glob("*-0*.npy")}
    again = _build(facts, kind, enc, workers=2)
    assert {f: (again.directory / f).read_bytes() for f in files} == files
    assert not partial.exists() and kept
    import shutil

    shutil.rmtree(out)  # built with BLOCK = 256: the other tests build their own


@pytest.mark.parametrize(("kind", "enc"), KINDS)
def test_the_stored_index_answers_a_live_query_as_the_build_did(facts, kind, enc):
    db = _build(facts, kind, enc, workers=1)
    data = TokenData.open(facts)
    live = db.retriever(data)
    from attnlab.data.retrieval import neighbour_tokens

    for c in (0, 7, 31):
        want = neighbour_tokens(data.train, np.asarray(db.val)[c], 16, 32, data.eos_id)
        assert np.array_equal(live(np.asarray(data.val[c * 16 : (c + 1) * 16])), want)


def test_planted_facts_are_retrieved(facts):
    """The chunk holding a validation key gets a neighbour stating the same fact far more often
    than a shuffled database would give it."""
    data = TokenData.open(facts)
    st = load_statements(facts, "val")
    db = _build(facts, "bm25", "words", workers=1)
    got = fact_recall(db, data, st)
    rng = np.random.default_rng(0)
    shuffled = np.asarray(db.val)[rng.permutation(len(db.val))]
    base = fact_recall(Database(db.directory, db.meta, db.train, shuffled), data, st)
    assert got["statements"] == len(st) and got["key"] >= 0.5 and base["key"] <= 0.1


def test_a_format_1_database_keeps_loading(facts, tmp_path):
    """A database of an earlier attnlab (format 1, no index or leakage fields) opens as
    bm25-bigrams with the query-chunk rule, and a build with its settings reuses it, warning."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(facts, data, ignore=shutil.ignore_patterns("retrieval"))
    db = _build(data, "bm25-bigrams", "bigrams", workers=1)
    meta = json.loads((db.directory / "meta.json").read_text())
    for key in ("leakage", "index", "index_files"):
        meta.pop(key)
    meta["version"], meta["block"] = 1, 256
    (db.directory / "meta.json").write_text(json.dumps(meta))
    old = Database.open(db.directory)
    assert old.index.kind == "bm25-bigrams" and old.leakage == "query-chunk"
    with pytest.warns(RetrievalWarning, match="earlier attnlab"):
        again = build_database(data, chunk_size=16, neighbours=2, workers=1)
    assert again.meta["version"] == 1
    assert database_dir(data, 16, 2, 16) == db.directory


def test_cli_kind_and_encoder(facts, capsys):
    args = ["data", "retrieval", "--data", str(facts), "--chunk-size", "16", "--workers", "1"]
    assert main([*args, "--kind", "hnsw"]) == 0
    out = capsys.readouterr().out
    assert "m16-k2-c16-hnsw-random" in out and "faiss HNSW" in out and "reading-tokens" in out
    assert main([*args, "--kind", "hnsw", "--encoder", "words"]) == 2
    assert "does not go with --kind hnsw" in capsys.readouterr().err
    assert main([*args, "--kind", "faiss"]) == 2
    assert "not an index kind" in capsys.readouterr().err
