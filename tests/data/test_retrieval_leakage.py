"""Issue 36, the leakage rule per reading token: a neighbour never shares a document with the
chunk or with any token that reads it (the chunk's last token and the next chunk, under chunked
cross-attention's shift), for every index kind; a planted sentence at a document boundary; the
over-fetch fallback through faiss' filter and the bounded BM25's rule-before-top-k, on the
largest database the suite affords."""

from __future__ import annotations

import json
import random
import warnings
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("bm25s")
pytest.importorskip("faiss")

from attnlab.data import TokenData, prepare
from attnlab.data.retrieval import RetrievalWarning, build_database
from attnlab.data.retrieval_index import index_spec
from attnlab.data.retrieval_index.leakage import document_ids
from attnlab.data.synth_facts import SYLLABLES

M = 32
PLANT = "Qzx vlorp jumbo quartz gnash."  # 29 bytes: inside one chunk of 32
KINDS = [("bm25-bigrams", "bigrams"), ("bm25", "words"), ("hnsw", "random")]


def _words(rng: random.Random, n: int) -> str:
    return " ".join(
        "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(n)
    )


@pytest.fixture(scope="module")
def boundary(tmp_path_factory) -> Path:
    """Documents A, B first in the training stream; A ends with PLANT, its last chunk ending on
    its end-of-text; B holds PLANT in its middle. Under the query-chunk rule A's last chunk takes
    B's PLANT chunk, and B's first tokens (which read A's last chunk's neighbours) see B's text."""
    rng = random.Random(0)
    root = tmp_path_factory.mktemp("boundary")
    head = _words(rng, 60)
    pad = (-(len(head) + 1 + len(PLANT) + 1)) % M  # A's bytes + eos: a multiple of M
    a = f"{head} {'x' * pad}{PLANT}" if pad else f"{head} {PLANT}"
    a = a[: len(a)] if (len(a) + 1) % M == 0 else a
    b = f"{_words(rng, 40)} {PLANT} {_words(rng, 40)}"
    others = [_words(rng, rng.randint(40, 90)) for _ in range(120)]
    lines = [json.dumps({"text": t}) for t in [a, b, *others]]
    (root / "c.jsonl").write_text("\n".join(lines) + "\n")
    prepare(str(root / "c.jsonl"), "bytes", root / "data", val_fraction=0.1, progress=False)
    return root / "data"


def _db(data: Path, kind: str, enc: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RetrievalWarning)
        return build_database(
            data, chunk_size=M, neighbours=2, workers=1, index=index_spec(kind, enc)
        )


def _assert_no_reader_leak(db, train: np.ndarray, eos: int) -> None:
    """Every training chunk c: no neighbour (with its continuation) shares a document with
    tokens [c M, (c + 2) M), vectorised over the whole database."""
    docs = document_ids(train, eos)
    n, r = len(db.train), db.neighbour_len
    c = np.arange(n)
    lo, hi = docs[c * M], docs[np.minimum((c + 2) * M, len(train)) - 1]
    idx = np.asarray(db.train)
    for j in range(idx.shape[1]):
        nb = idx[:, j]
        ok = nb >= 0
        nlo = docs[nb[ok] * M]
        nhi = docs[np.minimum(nb[ok] * M + r, len(train)) - 1]
        assert ((nhi < lo[ok]) | (nlo > hi[ok])).all()


@pytest.mark.parametrize(("kind", "enc"), KINDS)
def test_a_boundary_chunk_never_takes_the_next_documents_text(boundary, kind, enc):
    data = TokenData.open(boundary)
    train = np.asarray(data.train)
    docs = document_ids(train, data.eos_id)
    text = train.astype(np.uint8).tobytes()
    at = [i for i in range(len(text)) if text.startswith(PLANT.encode(), i)]
    assert [int(docs[i]) for i in at] == [0, 1], "premise: PLANT ends A (doc 0), is inside B"
    c = int(np.nonzero(docs == 0)[0][-1]) // M  # A's last chunk
    assert docs[c * M] == 0 and docs[(c + 1) * M] == 1  # the next chunk is B's: it reads c
    db = _db(boundary, kind, enc)
    r = db.neighbour_len
    b_plant = at[1] // M
    # premise: without the rule, A's last chunk's best other chunk is B's PLANT chunk
    live = db.retriever(data)
    got = live(train[c * M : (c + 1) * M])
    assert any(PLANT[:12].encode() in row.astype(np.uint8).tobytes() for row in got)
    assert b_plant not in set(np.asarray(db.train)[c].tolist())
    for j in np.asarray(db.train)[c]:
        assert (
            j < 0 or docs[min(j * M + r, len(train)) - 1] > 1 or docs[j * M] > 1 or j * M + r <= 0
        )
    _assert_no_reader_leak(db, train, data.eos_id)


@pytest.fixture(scope="module")
def long_documents(tmp_path_factory) -> Path:
    """44 documents of about 6,000 bytes (about 190 chunks each), mostly of its own words: every
    training chunk's own and next documents hold far more chunks than the index over-fetches."""
    rng = random.Random(1)
    root = tmp_path_factory.mktemp("long")
    lines = []
    shared = _words(rng, 200).split()
    for _ in range(44):  # mostly its own 40 words: a document's chunks are each other's best
        own = _words(rng, 40).split()
        pick = [rng.choice(own if rng.random() < 0.7 else shared) for _ in range(900)]
        lines.append(json.dumps({"text": " ".join(pick)}))
    (root / "c.jsonl").write_text("\n".join(lines) + "\n")
    prepare(str(root / "c.jsonl"), "bytes", root / "data", val_fraction=0.1, progress=False)
    return root / "data"


def test_hnsw_fills_every_slot_through_the_index_filter(long_documents, monkeypatch):
    """Same-document chunks rank first, so over-fetching alone leaves queries short; the
    fallback through faiss' IDSelector, in every shard, fills every slot, none leaking."""
    import faiss

    import attnlab.data.retrieval_index.dense as dense

    filtered = []
    orig_range = faiss.IDSelectorRange

    def id_range(*a):
        filtered.append(True)
        return orig_range(*a)

    # byte-level random projections are weakly topical: with no over-fetch a chunk's own
    monkeypatch.setattr(dense, "OVERFETCH", 0)  # vector (first) is excluded
    monkeypatch.setattr(faiss, "IDSelectorRange", id_range)
    data = TokenData.open(long_documents)
    db = _db(long_documents, "hnsw", "random")
    assert len(db.train) > 5000 and db.index.shards == 2
    assert sum(filtered) > 0  # the fallback ran
    _assert_no_reader_leak(db, np.asarray(data.train), data.eos_id)
    assert db.short("train") == 0 and db.short("val") == 0


def test_bm25_applies_the_rule_before_its_top_k(long_documents):
    """Same-document chunks rank first; the bounded BM25 search ranks every chunk its kept
    postings reach and drops the excluded ones before taking k, so none leaks and a slot is
    empty only when fewer than k allowed chunks are reachable."""
    from attnlab.data.retrieval_index import bm25, terms
    from attnlab.data.retrieval_index.leakage import training_exclusions

    data = TokenData.open(long_documents)
    db = _db(long_documents, "bm25", "words")
    assert len(db.train) > 5000
    train = np.asarray(data.train)
    _assert_no_reader_leak(db, train, data.eos_id)
    spec = db.index
    pruned = bm25.pruned(bm25.load(db.directory / "bm25"), spec)
    ids, _ = terms.term_ids(train, M, data.tokenizer.decode)
    first, last = training_exclusions(train, data.eos_id, M, 2 * M)
    reach = []  # per term, the chunks its kept postings reach
    for t in range(len(pruned.df)):
        reach.append(set(pruned.chunks[pruned.indptr[t] : pruned.indptr[t + 1]].tolist()))

    def reachable(c: int) -> set[int]:
        kept = sorted(set(ids[c]), key=lambda t: (pruned.df[t], t))[: spec.query_terms]
        return {j for t in kept for j in reach[t]}

    sample = range(0, len(ids), 25)
    own = [c for c in sample if any(first[c] <= j < last[c] for j in reachable(c))]
    assert len(own) > len(sample) // 2  # most queries reach their own documents: the rule works
    for c in np.nonzero((np.asarray(db.train) < 0).any(axis=1))[0]:
        assert len({j for j in reachable(c) if not first[c] <= j < last[c]}) < 2, c
