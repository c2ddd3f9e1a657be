"""``prepare`` / ``TokenData`` / the document split / ``attnlab data`` CLI."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from attnlab.base.errors import UserError
from attnlab.cli import main
from attnlab.data import TokenData, load_tokenizer, prepare, read_meta, token_dtype
from attnlab.data import preparation as prepare_mod
from attnlab.data.split import assign_splits, document_u
from attnlab.data.tokenizer import Tokenizer

DOCS = [f"Document number {i}: " + "some words here. " * (i % 7 + 1) for i in range(60)]


def write_jsonl(path: Path, docs: Sequence[str]) -> Path:
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return path


def split_docs(directory: Path, split: str, eos: int) -> list[str]:
    data = TokenData.open(directory)
    ids = np.asarray(data.split(split)).tolist()
    assert ids[-1] == eos  # every document, including the last, ends with eos
    docs, cur = [], []
    for i in ids:
        if i == eos:
            docs.append(data.tokenizer.decode(cur))
            cur = []
        else:
            cur.append(i)
    return docs


# ---------------------------------------------------------------------------------------- split


def test_document_split_is_deterministic_disjoint_and_near_fraction() -> None:
    docs = [f"doc {i}" for i in range(2000)]
    u = [document_u(d) for d in docs]
    is_val = assign_splits(u, 0.1)
    assert np.array_equal(is_val, assign_splits([document_u(d) for d in docs], 0.1))
    assert 0.08 < is_val.mean() < 0.12
    # order-independent: shuffling documents moves no document across the split
    perm = np.random.default_rng(0).permutation(len(docs))
    shuffled = assign_splits([document_u(docs[i]) for i in perm], 0.1)
    assert np.array_equal(shuffled, is_val[perm])
    # another seed gives another split
    assert not np.array_equal(assign_splits([document_u(d, seed=1) for d in docs], 0.1), is_val)


def test_split_keeps_both_sides_non_empty() -> None:
    assert assign_splits([0.9, 0.8], 0.05).tolist() == [False, True]
    assert assign_splits([0.01, 0.02], 0.5).tolist() == [True, False]
    assert not assign_splits([0.01, 0.02], 0.0).any()


# -------------------------------------------------------------------------------------- prepare


@pytest.mark.fast
def test_prepare_jsonl_bytes(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "docs.jsonl", DOCS)
    meta = prepare(str(src), "bytes", tmp_path / "out", val_fraction=0.2)
    out = tmp_path / "out"
    assert meta == read_meta(out)
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == 257 and meta["eos_id"] == 256
    train, val = meta["splits"]["train"], meta["splits"]["val"]
    assert train["documents"] + val["documents"] == len(DOCS) == meta["documents"]
    assert val["documents"] > 0
    assert train["tokens"] + val["tokens"] == sum(len(d.encode()) + 1 for d in DOCS)
    # files are exact: size, hash, and decoded documents
    for split in ("train", "val"):
        raw = (out / f"{split}.bin").read_bytes()
        assert len(raw) == 2 * meta["splits"][split]["tokens"]
        assert hashlib.sha256(raw).hexdigest() == meta["splits"][split]["sha256"]
    combined = hashlib.sha256(
        bytes.fromhex(train["sha256"]) + bytes.fromhex(val["sha256"])
    ).hexdigest()
    assert meta["content_hash"] == combined
    got_val = split_docs(out, "val", 256)
    got_train = split_docs(out, "train", 256)
    assert sorted(got_train + got_val) == sorted(DOCS)
    assert not set(got_train) & set(got_val)
    assert got_val == [d for d in DOCS if d in set(got_val)]  # document order is kept
    data = TokenData.open(out, verify=True)
    assert isinstance(data.train, np.memmap) and data.train.dtype == np.uint16
    assert not list(tmp_path.glob(".out*"))  # no temporary directory left behind


def test_prepare_txt_and_parquet_with_bpe(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, d in enumerate(DOCS[:30]):
        (corpus / f"{i:02d}.txt").write_text(d)
    pq.write_table(pa.table({"text": DOCS[30:]}), corpus / "rest.parquet")
    meta = prepare(str(corpus), "bpe-300", tmp_path / "out", val_fraction=0.1)
    assert 257 < meta["vocab_size"] <= 300 and meta["tokenizer"]["name"] == "bpe-300"
    assert (tmp_path / "out" / "tokenizer.json").exists()
    assert meta["documents"] == len(DOCS)
    docs = split_docs(tmp_path / "out", "train", meta["eos_id"])
    docs += split_docs(tmp_path / "out", "val", meta["eos_id"])
    assert sorted(docs) == sorted(DOCS)
    again = load_tokenizer(None, data_dir=tmp_path / "out")
    assert again.encode(DOCS[0]) == load_tokenizer(str(tmp_path / "out")).encode(DOCS[0])
    with pytest.raises(UserError, match="prepared with tokenizer 'bpe-300', not 'gpt2'"):
        load_tokenizer("gpt2", data_dir=tmp_path / "out")


def test_prepare_max_documents_and_split_stability(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "d.jsonl", DOCS)
    full = prepare(str(src), "bytes", tmp_path / "a", val_fraction=0.2)
    part = prepare(str(src), "bytes", tmp_path / "b", val_fraction=0.2, max_documents=40)
    assert part["documents"] == 40
    val_full = set(split_docs(tmp_path / "a", "val", 256))
    val_part = set(split_docs(tmp_path / "b", "val", 256))
    assert val_part == {d for d in DOCS[:40] if d in val_full}
    assert full["content_hash"] != part["content_hash"]


class FakeTokenizer(Tokenizer):
    """Bytes shifted into a large id range, to exercise the dtype choice."""

    name = "fake"

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.eos_id = vocab_size - 1

    def encode(self, text: str) -> list[int]:
        return [self.vocab_size - 300 + b for b in text.encode()]

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i - (self.vocab_size - 300) for i in ids).decode()

    def save(self, directory: Path) -> dict[str, Any]:
        return {"kind": "fake", "name": self.name}


def test_dtype_follows_vocab_size(tmp_path: Path, monkeypatch) -> None:
    assert token_dtype(257) == np.uint16 and token_dtype(65536) == np.uint16
    assert token_dtype(65537) == np.uint32 and token_dtype(2**32) == np.uint32
    with pytest.raises(UserError, match="exceeds 2\\*\\*32"):
        token_dtype(2**32 + 1)
    src = write_jsonl(tmp_path / "d.jsonl", DOCS[:10])
    monkeypatch.setattr(prepare_mod, "load_tokenizer", lambda name: FakeTokenizer(70_000))
    meta = prepare(str(src), "fake", tmp_path / "big", val_fraction=0.2)
    assert meta["dtype"] == "uint32"
    data = TokenData.open(tmp_path / "big")
    assert data.train.dtype == np.uint32 and int(np.max(data.train)) == 69_999
    monkeypatch.setattr(prepare_mod, "load_tokenizer", lambda name: FakeTokenizer(2**32 + 10))
    with pytest.raises(UserError, match="exceeds 2\\*\\*32"):
        prepare(str(src), "fake", tmp_path / "huge")
    assert not (tmp_path / "huge").exists()


def test_prepare_error_paths(tmp_path: Path) -> None:
    empty = write_jsonl(tmp_path / "empty.jsonl", ["", "   \n"])
    with pytest.raises(UserError, match="no non-empty documents"):
        prepare(str(empty), "bytes", tmp_path / "o1")
    assert not (tmp_path / "o1").exists()  # nothing half-written
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok text\n\x80 more")
    with pytest.raises(UserError, match=r"bad\.txt: invalid UTF-8 at byte offset 8"):
        prepare(str(bad), "bytes", tmp_path / "o2", val_fraction=0)
    meta = prepare(str(bad), "bytes", tmp_path / "o2", val_fraction=0, replace_invalid_utf8=True)
    assert split_docs(tmp_path / "o2", "train", 256) == ["ok text\n\ufffd more"]
    assert meta["splits"]["val"]["tokens"] == 0
    with pytest.raises(UserError, match="single document"):
        prepare(str(bad), "bytes", tmp_path / "o3", replace_invalid_utf8=True)
    with pytest.raises(UserError, match="does not exist"):
        prepare(str(tmp_path / "nope.txt"), "bytes", tmp_path / "o4")
    with pytest.raises(UserError, match="matched no files"):
        prepare(str(tmp_path / "*.parquet"), "bytes", tmp_path / "o5")
    surrogate = tmp_path / "s.jsonl"
    surrogate.write_text('{"text": "a\\ud800b"}\n{"text": "fine"}\n')
    with pytest.raises(UserError, match="unpaired surrogate"):
        prepare(str(surrogate), "bytes", tmp_path / "o6")
    prepare(str(surrogate), "bytes", tmp_path / "o6", replace_invalid_utf8=True)


def test_out_dir_rules(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "d.jsonl", DOCS[:10])
    prepare(str(src), "bytes", tmp_path / "out")
    with pytest.raises(UserError, match=r"already a prepared data directory.*--force"):
        prepare(str(src), "bytes", tmp_path / "out")
    (tmp_path / "out" / "schedules").mkdir()
    prepare(str(src), "bytes", tmp_path / "out", overwrite=True, max_documents=5)
    assert read_meta(tmp_path / "out")["documents"] == 5
    assert not (tmp_path / "out" / "schedules").exists()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "file").write_text("x")
    with pytest.raises(UserError, match="not a prepared data directory"):
        prepare(str(src), "bytes", tmp_path / "other")


def test_open_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        TokenData.open(tmp_path / "missing")
    with pytest.raises(UserError, match=r"no meta\.json"):
        TokenData.open(tmp_path)
    src = write_jsonl(tmp_path / "d.jsonl", DOCS[:10])
    prepare(str(src), "bytes", tmp_path / "out")
    with open(tmp_path / "out" / "train.bin", "ab") as f:
        f.write(b"\0\0")
    with pytest.raises(UserError, match="corrupt or half-copied"):
        TokenData.open(tmp_path / "out")


def test_cli_prepare_and_info(tmp_path: Path, capsys) -> None:
    src = write_jsonl(tmp_path / "d.jsonl", DOCS[:20])
    out = tmp_path / "cli"
    assert main(["data", "prepare", "--corpus", str(src), "--out", str(out), "--no-progress"]) == 0
    assert main(["data", "info", str(out), "--verify"]) == 0
    text = capsys.readouterr().out
    assert "bytes" in text and "train" in text
    assert "every file matches meta.json (train.bin, val.bin, meta.json)" in text
    assert main(["data", "info", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["documents"] == 20
    assert main(["data", "info", str(tmp_path)]) == 2
    assert "no meta.json" in capsys.readouterr().err
    assert main(["data", "prepare", "--corpus", str(tmp_path / "x.txt"), "--out", "o"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_default_data_dir() -> None:
    from attnlab.data import default_data_dir

    assert default_data_dir("wiki-sample", "bpe-4096") == Path("data/wiki-sample-bpe-4096")
    assert default_data_dir("corpora/books.jsonl", "gpt2").name == "books-gpt2"
    assert default_data_dir("hf:HuggingFaceFW/fineweb-edu", "gpt2").name == (
        "hf-HuggingFaceFW-fineweb-edu-gpt2"
    )


def test_ensure_prepared_prepares_once_and_refuses_other_settings(tmp_path: Path) -> None:
    from attnlab.config import DataConfig
    from attnlab.data import ensure_prepared

    src = write_jsonl(tmp_path / "d.jsonl", DOCS[:12])
    cfg = DataConfig(corpus=str(src), tokenizer="bytes", dir=str(tmp_path / "auto"))
    first = ensure_prepared(cfg)
    again = ensure_prepared(cfg)
    assert first.content_hash == again.content_hash and first.meta["documents"] == 12
    with pytest.raises(UserError, match=r"set data\.dir to another directory"):
        ensure_prepared(cfg.model_copy(update={"tokenizer": "gpt2"}))
