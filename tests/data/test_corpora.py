"""Corpus sources: local files, dispatch, Hub (mocked), Debian packages (handmade files)."""

from __future__ import annotations

import gzip
import json
import sys
import types
from pathlib import Path

import pytest

from attnlab.base.errors import UserError
from attnlab.data import hub, open_corpus, registered_corpora
from attnlab.data import local as local_mod
from attnlab.data.corpus import SourceOptions
from attnlab.data.debian import (
    DictdCorpus,
    _gcide,
    _python_doc,
    _wordnet,
    clean_rst,
    dictd_number,
    group_verses,
    parse_wordnet_line,
)

# ----------------------------------------------------------------------------------- local files


def test_txt_file_is_one_document(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("\ufeffHello.\n\nSecond paragraph.")
    assert list(open_corpus(str(tmp_path / "a.txt")).documents()) == ["Hello.\n\nSecond paragraph."]


def test_large_txt_is_split_at_blank_lines(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(local_mod, "TXT_SPLIT_CHARS", 100)
    monkeypatch.setattr(local_mod, "TXT_CHUNK_CHARS", 30)
    paras = [f"paragraph number {i} ok" for i in range(10)]
    (tmp_path / "big.txt").write_text("\n\n".join(paras))
    docs = list(open_corpus(str(tmp_path / "big.txt")).documents())
    assert len(docs) > 1
    assert "\n\n".join(docs) == "\n\n".join(paras)  # nothing lost, paragraphs intact


def test_jsonl_field_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "one"}\n\n{"text": "two", "id": 3}\n')
    assert list(open_corpus(str(path)).documents()) == ["one", "two"]
    path.write_text('{"body": "x"}\n')
    assert list(open_corpus(str(path), text_field="body").documents()) == ["x"]
    with pytest.raises(UserError, match=r"d\.jsonl:1: no 'text' field.*--text-field"):
        list(open_corpus(str(path)).documents())
    path.write_text('{"text": "ok"}\n{broken\n')
    with pytest.raises(UserError, match=r"d\.jsonl:2: not valid JSON"):
        list(open_corpus(str(path)).documents())


def test_jsonl_gz(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"text": "zipped"}\n'))
    assert list(open_corpus(str(path)).documents()) == ["zipped"]


def test_parquet_column(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": ["a", None, "b"], "n": [1, 2, 3]}), path)
    assert list(open_corpus(str(path)).documents()) == ["a", "b"]
    with pytest.raises(UserError, match=r"no column 'body'.*columns: \['text', 'n'\]"):
        list(open_corpus(str(path), text_field="body").documents())


def test_invalid_utf8_names_file_and_offset(tmp_path: Path) -> None:
    path = tmp_path / "bad.txt"
    path.write_bytes(b"abc\xffdef")
    with pytest.raises(UserError, match=r"bad\.txt: invalid UTF-8 at byte offset 3 .*"
                       r"--replace-invalid-utf8"):  # fmt: skip
        list(open_corpus(str(path)).documents())
    docs = list(open_corpus(str(path), replace_invalid_utf8=True).documents())
    assert docs == ["abc\ufffddef"]


def test_invalid_utf8_offset_in_jsonl_counts_earlier_lines(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    first = b'{"text": "fine"}\n'
    path.write_bytes(first + b'{"text": "x\xc3"}\n')
    with pytest.raises(UserError, match=rf"byte offset {len(first) + 11}\b"):
        list(open_corpus(str(path)).documents())


def test_directory_and_glob(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.txt").write_text("B")
    (tmp_path / "sub" / "a.jsonl").write_text('{"text": "A"}\n')
    (tmp_path / "README.md").write_text("ignored in a directory")
    assert sorted(open_corpus(str(tmp_path)).documents()) == ["A", "B"]
    assert list(open_corpus(str(tmp_path / "*.txt")).documents()) == ["B"]
    assert list(open_corpus(str(tmp_path / "**" / "*.jsonl")).documents()) == ["A"]
    with pytest.raises(UserError, match="unsupported files"):
        open_corpus(str(tmp_path / "*.md"))


def test_path_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        open_corpus(str(tmp_path / "missing.txt"))
    with pytest.raises(UserError, match="matched no files"):
        open_corpus(str(tmp_path / "*.jsonl"))
    with pytest.raises(UserError, match=r"no .* files"):
        open_corpus(str(tmp_path))
    (tmp_path / "x.csv").write_text("a,b")
    with pytest.raises(UserError, match="unsupported file type"):
        open_corpus(str(tmp_path / "x.csv"))


def test_unknown_name_suggests_nearest() -> None:
    with pytest.raises(UserError, match="did you mean 'wiki-sample'"):
        open_corpus("wiki-sampel")
    assert {"wiki-sample", "dict-gcide", "wordnet", "bible-kjv", "python-doc"} <= set(
        registered_corpora()
    )


SOURCES = {"attnlab.data.wiki", "attnlab.data.debian", "attnlab.data.hub", "attnlab.data.local"}


def test_sources_are_imported_on_first_lookup_only(loaded_modules, tmp_path: Path) -> None:
    assert not SOURCES & loaded_modules("import attnlab.data, attnlab.data.corpus")
    listed = loaded_modules("from attnlab.data import registered_corpora; registered_corpora()")
    assert SOURCES & listed == {"attnlab.data.wiki", "attnlab.data.debian"}
    (tmp_path / "a.txt").write_text("text")
    opened = loaded_modules(
        f"from attnlab.data import open_corpus; open_corpus({str(tmp_path / 'a.txt')!r})"
    )
    assert "attnlab.data.local" in opened and "attnlab.data.hub" not in opened


def test_a_registered_source_is_found_by_name() -> None:
    from attnlab.data import Corpus, register_corpus
    from attnlab.data.corpus import REGISTRY

    class Two(Corpus):
        name = "two-docs"

        def __init__(self, options: SourceOptions) -> None:
            self.options = options

        def documents(self):
            yield from ("one", "two")

    try:
        register_corpus("two-docs", "two tiny documents")(Two)
        assert registered_corpora()["two-docs"] == "two tiny documents"
        corpus = open_corpus(" two-docs ", text_field="body")
        assert isinstance(corpus, Two) and corpus.options.text_field == "body"
        assert list(corpus.documents()) == ["one", "two"]
    finally:
        REGISTRY.pop("two-docs", None)


# ------------------------------------------------------------------------------------------ hub


class _FakeDatasets(types.ModuleType):
    def __init__(self, rows=None, error: Exception | None = None) -> None:
        super().__init__("datasets")
        self.rows, self.error, self.calls = rows or [], error, []

    def load_dataset(self, path, name=None, split=None, streaming=False):
        self.calls.append((path, name, split, streaming))
        if self.error:
            raise self.error
        return iter(self.rows)


def test_hub_dispatch_uses_aliases_and_streaming(monkeypatch) -> None:
    fake = _FakeDatasets(rows=[{"text": "a"}, {"text": "b"}])
    monkeypatch.setitem(sys.modules, "datasets", fake)
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout=3.0: True)
    assert list(open_corpus("hf:fineweb-edu").documents()) == ["a", "b"]
    assert fake.calls[-1] == ("HuggingFaceFW/fineweb-edu", "sample-10BT", "train", True)
    list(open_corpus("hf:openwebtext").documents())
    assert fake.calls[-1][:2] == ("Skylion007/openwebtext", None)
    corpus = open_corpus("hf:org/some-set:cfg")
    list(corpus.documents())
    assert fake.calls[-1][:2] == ("org/some-set", "cfg") and corpus.name == "hf-org-some-set-cfg"


def test_hub_wikitext_lines_are_grouped_into_articles(monkeypatch) -> None:
    lines = ["", " = Alpha = \n", "", " text a \n", " = = Sub = = \n", " more a \n",
             " = Beta = \n", " text b \n"]  # fmt: skip
    fake = _FakeDatasets(rows=[{"text": t} for t in lines])
    monkeypatch.setitem(sys.modules, "datasets", fake)
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout=3.0: True)
    docs = list(open_corpus("hf:wikitext-103").documents())
    assert fake.calls[-1][:2] == ("Salesforce/wikitext", "wikitext-103-raw-v1")
    assert len(docs) == 2 and docs[0].startswith("= Alpha =") and "more a" in docs[0]
    assert docs[1].startswith("= Beta =")


def test_hub_offline_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(UserError, match=r"Hub is unreachable.*wiki-sample"):
        list(open_corpus("hf:wikitext-103").documents())


def test_hub_load_failure_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", _FakeDatasets(error=ConnectionError("boom")))
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout=3.0: True)
    with pytest.raises(UserError, match=r"cannot load nope/x .*ConnectionError: boom.*wiki-sample"):
        list(open_corpus("hf:nope/x").documents())


def test_hub_missing_text_field(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", _FakeDatasets(rows=[{"content": "x"}]))
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout=3.0: True)
    with pytest.raises(UserError, match=r"no 'text' field .*content"):
        list(open_corpus("hf:a/b").documents())
    assert list(open_corpus("hf:a/b", text_field="content").documents()) == ["x"]


# --------------------------------------------------------------------------------------- debian


def test_dictd_numbers_are_base64_digits() -> None:
    assert dictd_number("A") == 0 and dictd_number("Fz") == 5 * 64 + 51
    assert dictd_number("+8") == 62 * 64 + 60


def _b64(n: int) -> str:
    digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    out = ""
    while True:
        out = digits[n % 64] + out
        n //= 64
        if not n:
            return out


def test_gcide_reads_entries_from_index_and_dictzip(tmp_path: Path) -> None:
    header = b"00-database-info\n   license text\n\n"
    e1 = b"Cat \\Cat\\, n.\n   A small\n   animal.\n\n"
    e2 = b"Dog \\Dog\\, n.\n   A loyal animal.\n"
    data = header + e1 + e2
    d = tmp_path / "usr/share/dictd"
    d.mkdir(parents=True)
    (d / "gcide.dict.dz").write_bytes(gzip.compress(data))
    rows = [
        ("00-database-info", 0, len(header)),
        ("cat", len(header), len(e1)),
        ("Cat", len(header), len(e1)),  # two headwords, one entry
        ("dog", len(header) + len(e1), len(e2)),
    ]
    (d / "gcide.index").write_text("".join(f"{h}\t{_b64(o)}\t{_b64(n)}\n" for h, o, n in rows))
    corpus = _gcide(SourceOptions(), tmp_path)
    assert isinstance(corpus, DictdCorpus)
    assert list(corpus.documents()) == [
        "Cat \\Cat\\, n. A small animal.",
        "Dog \\Dog\\, n. A loyal animal.",
    ]


def test_wordnet_line() -> None:
    line = (
        "02084071 05 n 03 dog 0 domestic_dog 0 Canis_familiaris 0 023 @ 02083346 n 0000 "
        '| a member of the genus Canis; "the dog barked all night"  \n'
    )
    assert parse_wordnet_line(line) == (
        'dog, domestic dog, Canis familiaris: a member of the genus Canis; "the dog barked all night"'
    )
    assert parse_wordnet_line("  1 This software and database is being provided\n") is None


def test_bible_verses_grouped_by_chapter() -> None:
    out = ["Ge1:1 In the beginning.", "Ge1:2 And the earth.", "Ge2:1 Thus.", "1Jo1:1 That which."]
    assert list(group_verses(out)) == ["In the beginning.\nAnd the earth.", "Thus.", "That which."]


def test_clean_rst() -> None:
    rst = (
        "heapq\n=====\n\n.. module:: heapq\n   :synopsis: Heaps.\n\n"
        "Use :func:`heappush` and ``heap[0]``, see `docs <http://x>`_.\n"
    )
    assert clean_rst(rst) == "heapq\n\nUse heappush and heap[0], see docs."


def test_missing_debian_packages_say_what_to_install(tmp_path: Path) -> None:
    for factory, package in ((_gcide, "dict-gcide"), (_wordnet, "wordnet-base"),
                             (_python_doc, "python3-doc")):  # fmt: skip
        with pytest.raises(UserError, match=rf"apt-get install {package}"):
            list(factory(SourceOptions(), tmp_path).documents())


@pytest.mark.skipif(not Path("/usr/share/wordnet/data.noun").exists(), reason="wordnet absent")
def test_installed_wordnet() -> None:
    docs = open_corpus("wordnet").documents()
    assert next(docs).startswith("entity: ")


def test_corpus_json_round_trip_of_attribution(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("x")
    corpus = open_corpus(str(tmp_path / "a.txt"))
    list(corpus.documents())
    assert json.loads(json.dumps(corpus.attribution()))["n_files"] == 1
