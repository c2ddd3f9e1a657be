"""Wikipedia articles as clean prose: MediaWiki XML dumps and a markup stripper.

``wiki-sample`` is the 106-article English Wikipedia extract shipped in gensim's test data
(about 3 MB of prose once markup is stripped; CC BY-SA 3.0). One document per article;
redirects, non-article namespaces, disambiguation pages and pages under ``MIN_CHARS`` are skipped.

The stripper keeps case and punctuation (unlike gensim's tokenizer). It removes templates
``{{..}}`` (keeping the text of a few inline ones such as ``{{lang|..|text}}`` and
``{{convert|5|km}}``), tables ``{|..|}``, ``<ref>`` notes, comments and other HTML tags,
file/category/interlanguage links, bold/italic quotes and list markers; ``[[a|b]]`` becomes ``b``,
``[url label]`` becomes ``label`` and ``==Heading==`` becomes ``Heading``. Reference-only sections
(References, External links, See also, ...) are dropped. Cost: a few regex passes, linear in text.
"""

from __future__ import annotations

import bz2
import html
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import IO, Any

from attnlab.base.errors import UserError
from attnlab.data.corpus import Corpus, SourceOptions, register_corpus

WIKI_SAMPLE_FILE = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
MIN_CHARS = 500

# ------------------------------------------------------------------------------------ XML pages


@dataclass(frozen=True)
class WikiPage:
    title: str
    namespace: int
    redirect: bool
    text: str


def iter_mediawiki_pages(stream: IO[bytes]) -> Iterator[WikiPage]:
    """Stream ``<page>`` elements of a MediaWiki XML export (any schema version)."""
    for _, el in ET.iterparse(stream, events=("end",)):
        if not el.tag.endswith("page"):
            continue
        ns = el.tag[: -len("page")]  # "{http://www.mediawiki.org/xml/export-0.10/}" or ""
        yield WikiPage(
            title=el.findtext(f"{ns}title") or "",
            namespace=int(el.findtext(f"{ns}ns") or 0),
            redirect=el.find(f"{ns}redirect") is not None,
            text=el.findtext(f"{ns}revision/{ns}text") or "",
        )
        el.clear()


# ------------------------------------------------------------------------------- markup stripper

_COMMENT = re.compile(r"<!--.*?(-->|$)", re.S)
_REF_SELF = re.compile(r"<ref\b[^>]*/>", re.I)
_REF = re.compile(r"<ref\b[^>]*>.*?</ref\s*>", re.I | re.S)
_DROP_BLOCKS = re.compile(
    r"<(math|gallery|timeline|imagemap|score|syntaxhighlight|source|code|pre|chem|hiero|"
    r"graph|mapframe|table)\b[^>]*>.*?</\1\s*>",
    re.I | re.S,
)
_BR = re.compile(r"<br\s*/?>", re.I)
_TAG = re.compile(r"</?[a-zA-Z][^<>]*>")
_INNER_TEMPLATE = re.compile(r"\{\{([^{}]*)\}\}")
_INNER_TABLE = re.compile(r"\{\|(?:(?!\{\|).)*?\|\}", re.S)
_LINK_PIPED = re.compile(r"\[\[:?([^\[\]|]*)\|([^\[\]]*)\]\]")
_LINK = re.compile(r"\[\[:?([^\[\]|]*)\]\]")
_EXT_LABELED = re.compile(r"\[(?:https?:|ftp:)?//[^\s\]]+\s+([^\]]*)\]")
_EXT_BARE = re.compile(r"\[(?:https?:|ftp:)?//[^\s\]]*\]")
_HEADING = re.compile(r"^(=+)\s*(.*?)\s*\1\s*$")
_QUOTES = re.compile(r"'{2,}")
_MAGIC = re.compile(r"__[A-Z]+__")
_LIST_MARK = re.compile(r"^[*#:;]+\s*")
_SPACES = re.compile(r"[ \t\u00a0]+")
_SPACE_PUNCT = re.compile(r" +([,.;:!?)])")
_EMPTY_PARENS = re.compile(r"\(\s*[,;:]?\s*\)")
_OPEN_PAREN_PUNCT = re.compile(r"\(\s*[,;:]\s*")
_MANY_NEWLINES = re.compile(r"\n{3,}")

_NON_PROSE_LINK = re.compile(
    r"\s*:?\s*(?:(?:file|image|media|category)\s*:|[a-z]{2,3}(?:-[a-z]{2,8})?:[^|\[\]]*\]\])",
    re.I,
)
_INTERWIKI_PREFIX = re.compile(
    r"^(?:wikt|wiktionary|w|wikipedia|s|q|n|b|v|commons|[a-z]{2,3}):", re.I
)
_DROP_SECTIONS = {
    "references",
    "external links",
    "see also",
    "further reading",
    "notes",
    "footnotes",
    "bibliography",
    "sources",
    "citations",
    "notes and references",
    "references and notes",
    "works cited",
    "primary sources",
    "secondary sources",
    "gallery",
}
# Inline templates whose last positional argument is running text.
_KEEP_LAST_ARG = re.compile(
    r"^(lang(-[a-z-]+)?|transl|nowrap|nobr|nobold|noitalic|small|smaller|smallcaps|sc|sic|"
    r"script|math|mvar|abbr|visible anchor|vanchor|em|strong|linktext|as written)$",
    re.I,
)
_SYMBOL_TEMPLATES = {
    "'": "'",
    "snd": " – ",
    "spnd": " – ",
    "ndash": "–",
    "mdash": "—",
    "nbsp": " ",
    "!": "|",
    "=": "=",
    "dash": " – ",
}
_CONVERT_RANGE = {"-", "–", "to", "and", "or", "by", "x", "×", "+/-", "±", "&"}


def _split_args(body: str) -> list[str]:
    """Split a template body on ``|`` outside ``[[..]]`` links."""
    parts, depth, cur = [], 0, []
    i = 0
    while i < len(body):
        two = body[i : i + 2]
        if two == "[[":
            depth += 1
            cur.append(two)
            i += 2
            continue
        if two == "]]" and depth:
            depth -= 1
            cur.append(two)
            i += 2
            continue
        if body[i] == "|" and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(body[i])
        i += 1
    parts.append("".join(cur))
    return [p.strip() for p in parts]


def _render_template(m: re.Match[str]) -> str:
    args = _split_args(m.group(1))
    name = args[0].strip().lower().replace("_", " ")
    positional = [a for a in args[1:] if "=" not in a.split("[[")[0]]
    if name in _SYMBOL_TEMPLATES:
        return _SYMBOL_TEMPLATES[name]
    if _KEEP_LAST_ARG.match(name) and positional:
        return positional[-1]
    if name in ("convert", "cvt") and len(positional) >= 2:
        if len(positional) >= 4 and positional[1] in _CONVERT_RANGE:
            return " ".join(positional[:4])
        return f"{positional[0]} {positional[1]}"
    return ""


def _remove_innermost(pattern: re.Pattern[str], text: str, repl: Any = "") -> str:
    while True:
        new = pattern.sub(repl, text)
        if new == text:
            return new
        text = new


def _remove_non_prose_links(text: str) -> str:
    """Drop ``[[File:..]]``, ``[[Category:..]]``, ``[[fr:..]]``, whose captions may nest links."""
    out, i, n = [], 0, len(text)
    while i < n:
        j = text.find("[[", i)
        if j < 0:
            out.append(text[i:])
            break
        out.append(text[i:j])
        if not _NON_PROSE_LINK.match(text, j + 2):
            out.append("[[")
            i = j + 2
            continue
        depth, k = 0, j
        while k < n:
            if text.startswith("[[", k):
                depth += 1
                k += 2
            elif text.startswith("]]", k):
                depth -= 1
                k += 2
                if depth == 0:
                    break
            else:
                k += 1
        i = k
    return "".join(out)


def _link_text(m: re.Match[str]) -> str:
    target = _INTERWIKI_PREFIX.sub("", m.group(1))
    return target.split("#")[0] or target.lstrip("#")


def _sections(lines: list[str]) -> list[tuple[int, str]]:
    """(heading level or 0 for body text, text); reference-only sections are left out."""
    out, skip_level = [], 0
    for line in lines:
        h = _HEADING.match(line)
        if h:
            level, title = len(h.group(1)), h.group(2).strip()
            if skip_level and level > skip_level:
                continue
            skip_level = level if title.lower() in _DROP_SECTIONS else 0
            if not skip_level:
                out.append((level, title))
        elif not skip_level:
            out.append((0, line))
    return out


def _clean_line(line: str) -> str:
    line = _LIST_MARK.sub("", line)
    line = _SPACES.sub(" ", line).strip()
    if line.startswith(("{{", "}}", "{|", "|}", "|")) or line in ("[[", "]]"):
        return ""  # unbalanced leftovers of broken markup
    line = _EMPTY_PARENS.sub("", line)
    line = _OPEN_PAREN_PUNCT.sub("(", line)
    return _SPACE_PUNCT.sub(r"\1", line)


def strip_wiki_markup(text: str) -> str:
    """MediaWiki markup -> plain prose with case and punctuation kept (see module docstring)."""
    text = _COMMENT.sub("", text)
    text = _REF_SELF.sub("", text)
    text = _REF.sub("", text)
    text = _DROP_BLOCKS.sub("", text)
    text = _remove_innermost(_INNER_TEMPLATE, text, _render_template)
    text = _remove_innermost(_INNER_TABLE, text)
    text = _remove_non_prose_links(text)
    text = _remove_innermost(_LINK_PIPED, text, r"\2")
    text = _LINK.sub(_link_text, text)
    text = _EXT_LABELED.sub(r"\1", text)
    text = _EXT_BARE.sub("", text)
    text = _BR.sub(" ", text)
    text = _TAG.sub("", text)
    text = _MAGIC.sub("", text)
    text = _QUOTES.sub("", text)
    text = html.unescape(text)

    items = [(level, _clean_line(line)) for level, line in _sections(text.split("\n"))]
    out: list[str] = []
    for i, (level, line) in enumerate(items):
        if not level:
            out.append(line)
            continue
        # A heading whose section holds no text (it was all markup) is not prose.
        nxt = next((lv for lv, ln in items[i + 1 :] if ln), None)
        if line and nxt is not None and (nxt == 0 or nxt > level):
            out.extend(("", line))
    return _MANY_NEWLINES.sub("\n\n", "\n".join(out)).strip()


# --------------------------------------------------------------------------------- wiki-sample


def wiki_sample_path() -> Path:
    """The gensim test-data dump, located without importing gensim (which is slow)."""
    spec = find_spec("gensim")
    if spec is None or not spec.submodule_search_locations:
        raise UserError(
            "the wiki-sample corpus needs gensim's test data: pip install gensim==4.4.0, or "
            "pip install 'attnlab[offline]' (or pass a local .txt/.jsonl/.parquet file as --corpus)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "test" / "test_data"
    path = path / WIKI_SAMPLE_FILE
    if not path.exists():
        raise UserError(
            f"gensim is installed but {WIKI_SAMPLE_FILE} is missing from its test data; "
            "reinstall with pip install --force-reinstall gensim==4.4.0"
        )
    return path


class MediaWikiDump(Corpus):
    """Articles of a ``.xml`` or ``.xml.bz2`` MediaWiki export, one clean document each."""

    def __init__(self, path: Path, name: str, min_chars: int = MIN_CHARS) -> None:
        self.path = path
        self.name = name
        self.min_chars = min_chars
        self.titles: list[str] = []

    def documents(self) -> Iterator[str]:
        self.titles = []
        opener = bz2.open if self.path.suffix == ".bz2" else open
        with opener(self.path, "rb") as f:
            for page in iter_mediawiki_pages(f):
                if page.redirect or page.namespace != 0 or "(disambiguation)" in page.title:
                    continue
                text = strip_wiki_markup(page.text)
                if len(text) < self.min_chars:
                    continue
                self.titles.append(page.title)
                yield text

    def attribution(self) -> dict[str, Any]:
        return {
            "source": self.name,
            "origin": "English Wikipedia, "
            "gensim 4.4.0 test data (gensim/test/test_data/" + self.path.name + ")",
            "license": "CC BY-SA 3.0 (https://creativecommons.org/licenses/by-sa/3.0/)",
            "credit": "Wikipedia contributors; article histories at https://en.wikipedia.org/",
            "n_articles": len(self.titles),
            "articles": list(self.titles),
        }


@register_corpus("wiki-sample", "106 English Wikipedia articles from gensim's test data (~3 MB)")
def _wiki_sample(options: SourceOptions) -> Corpus:
    return MediaWikiDump(wiki_sample_path(), name="wiki-sample")
