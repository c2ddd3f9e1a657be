"""MediaWiki parsing and markup stripping, and the wiki-sample corpus."""

from __future__ import annotations

import bz2
import importlib.util

import pytest

from attnlab.base.errors import UserError
from attnlab.data import open_corpus
from attnlab.data import wiki as wiki_mod
from attnlab.data.wiki import MediaWikiDump, iter_mediawiki_pages, strip_wiki_markup

ARTICLE = """{{Infobox person|name=Ada|birth_date={{birth date|1815|12|10}}}}
'''Ada Lovelace''' ({{lang-fr|Augusta Ada}}; 1815–1852) was an [[England|English]] \
[[mathematician]].<ref name="a">{{cite book|title=Ada}}</ref> She wrote \
''notes''<ref>Stein, p. 3.</ref> on the [[Analytical Engine]]s of \
[[Charles Babbage|Babbage]].<!-- hidden comment --> It was {{convert|5|km}} long.
[[File:Ada.jpg|thumb|Portrait of [[Ada Lovelace|Ada]] in 1840]]
{| class="wikitable"
|-
| cell one || cell two
|}
See [http://example.org the archive] and [http://example.org/bare].
The term ''[[wikt:algorithm|algorithm]]'' came later.<br/>Next&nbsp;line &amp; more.

== Early life ==
Her father was <small>[[Lord Byron]]</small>.
* A list item about [[poetry]]

== References ==
{{reflist}}
* Stein, Dorothy. ''Ada''.

[[Category:Mathematicians]]
[[fr:Ada Lovelace]]
"""


def test_strip_wiki_markup_keeps_prose_and_removes_markup() -> None:
    text = strip_wiki_markup(ARTICLE)
    assert text.startswith("Ada Lovelace (Augusta Ada; 1815–1852) was an English mathematician.")
    assert "She wrote notes on the Analytical Engines of Babbage." in text
    assert "It was 5 km long." in text
    assert "See the archive and." in text
    assert "The term algorithm came later." in text
    assert "Next line & more." in text
    assert "\n\nEarly life\nHer father was Lord Byron." in text
    assert "A list item about poetry" in text
    for junk in (
        "{{", "}}", "[[", "]]", "<ref", "cite book", "Infobox", "hidden comment", "wikitable",
        "cell one", "Portrait", "thumb", "Category", "Mathematicians", "fr:", "'''", "''",
        "References", "Stein", "http", "<small>", "&nbsp;",
    ):  # fmt: skip
        assert junk not in text, junk


def test_strip_wiki_markup_nested_templates_and_tables() -> None:
    assert strip_wiki_markup("a {{x|{{y|{{z}}}}}} b") == "a b"
    assert strip_wiki_markup("a\n{|\n|x\n{|\n|inner\n|}\n|}\nb") == "a\n\nb"
    assert strip_wiki_markup("[[Category:X]][[Image:a.png|left|[[b]] [[c|d]]]]kept") == "kept"


def _xml(pages: str) -> bytes:
    ns = "http://www.mediawiki.org/xml/export-0.10/"
    return f'<mediawiki xmlns="{ns}"><siteinfo/>{pages}</mediawiki>'.encode()


def _page(title: str, text: str, ns: int = 0, redirect: bool = False) -> str:
    red = f'<redirect title="{title}x" />' if redirect else ""
    return (
        f"<page><title>{title}</title><ns>{ns}</ns><id>1</id>{red}<revision><id>2</id>"
        f'<text xml:space="preserve">{text}</text></revision></page>'
    )


def test_mediawiki_dump_skips_redirects_other_namespaces_and_short_pages(tmp_path) -> None:
    long_text = "Real prose about a topic. " * 40
    xml = _xml(
        _page("Kept", "'''Kept''' " + long_text)
        + _page("Moved", "#REDIRECT [[Kept]]", redirect=True)
        + _page("Wikipedia:Policy", long_text, ns=4)
        + _page("Stub", "Too short.")
        + _page("Foo (disambiguation)", long_text)
        + _page("Also kept", "&lt;ref&gt;note&lt;/ref&gt;" + long_text)
    )
    path = tmp_path / "dump.xml.bz2"
    path.write_bytes(bz2.compress(xml))
    with bz2.open(path) as f:
        pages = list(iter_mediawiki_pages(f))
    assert [p.title for p in pages][:2] == ["Kept", "Moved"] and pages[1].redirect
    dump = MediaWikiDump(path, name="test")
    docs = list(dump.documents())
    assert len(docs) == 2
    assert docs[0].startswith("Kept Real prose")
    assert "note" not in docs[1]
    attribution = dump.attribution()
    assert attribution["articles"] == ["Kept", "Also kept"]
    assert "CC BY-SA" in attribution["license"]


@pytest.mark.skipif(importlib.util.find_spec("gensim") is None, reason="gensim not installed")
def test_wiki_sample_is_megabytes_of_clean_prose() -> None:
    corpus = open_corpus("wiki-sample")
    docs = list(corpus.documents())
    assert len(docs) >= 90
    size = sum(len(d.encode()) for d in docs)
    assert size > 2_000_000
    joined = "\n".join(docs)
    assert "Anarchism is a political philosophy" in joined
    assert joined.count("[[") == 0 and joined.count("<ref") == 0 and joined.count("{{") < 5
    meta = corpus.attribution()
    assert meta["n_articles"] == len(docs) and "Anarchism" in meta["articles"]


def test_wiki_sample_without_gensim_says_how_to_install(monkeypatch) -> None:
    monkeypatch.setattr(wiki_mod, "find_spec", lambda name: None)
    with pytest.raises(UserError, match=r"pip install gensim==4\.4\.0"):
        open_corpus("wiki-sample")
