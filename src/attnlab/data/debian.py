"""Larger offline corpora from Debian packages, read where ``apt-get install`` puts them.

============  ========================  =================================================  ==========
name          package                   files read                                         documents
============  ========================  =================================================  ==========
dict-gcide    dict-gcide                /usr/share/dictd/gcide.{index,dict.dz} (~40 MB)     entries
wordnet       wordnet-base              /usr/share/wordnet/data.{noun,verb,adj,adv}        synsets
bible-kjv     bible-kjv (+ -text)       ``bible -f Gen1:1-Rev22:21`` (/usr/lib/bible.data)  chapters
python-doc    python3.x-doc             /usr/share/doc/python3.x/html/_sources/**/*.rst.txt pages
============  ========================  =================================================  ==========

Each reader takes a ``root`` (default ``/``) so it can be pointed at an unpacked package.
A missing package is a ``UserError`` with the ``apt-get install`` line that fixes it.
"""

from __future__ import annotations

import gzip
import re
import shutil
import subprocess
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from attnlab.base.errors import UserError
from attnlab.data.corpus import Corpus, SourceOptions, register_corpus


def _missing(what: str, package: str, paths: str) -> UserError:
    return UserError(
        f"the {what} corpus is not installed ({paths} not found): "
        f"sudo apt-get install {package}, or use --corpus wiki-sample"
    )


_BLANK_LINE = re.compile(r"\n\s*\n")


def _paragraphs(text: str) -> str:
    """Re-flow hard-wrapped lines: blank lines separate paragraphs, other newlines are spaces."""
    paras = (" ".join([ln.strip() for ln in p.splitlines()]) for p in _BLANK_LINE.split(text))
    return "\n\n".join([p for p in paras if p])


# ------------------------------------------------------------------------------------ dict-gcide

_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_B64_VALUE = {c: i for i, c in enumerate(_B64)}


def dictd_number(text: str) -> int:
    """dictd's index numbers: base 64, most significant digit first (``"Fz"`` = 5*64 + 51)."""
    n = 0
    for c in text:
        n = n * 64 + _B64_VALUE[c]
    return n


class DictdCorpus(Corpus):
    """A dictd database (``NAME.index`` + ``NAME.dict[.dz]``), one document per entry."""

    def __init__(self, name: str, index: Path, package: str, license: str) -> None:
        self.name = name
        self.index = index
        self.package = package
        self.license = license

    def _dict_file(self) -> Path:
        for suffix in (".dict.dz", ".dict"):
            path = self.index.with_name(self.index.name.removesuffix(".index") + suffix)
            if path.exists():
                return path
        raise _missing(self.name, self.package, str(self.index.with_suffix(".dict.dz")))

    def documents(self) -> Iterator[str]:
        if not self.index.exists():
            raise _missing(self.name, self.package, str(self.index))
        path = self._dict_file()
        # zlib releases the GIL: the dictionary inflates on a second core while the index parses
        with ThreadPoolExecutor(1) as pool:
            data = pool.submit(_read_dict, path)
            spans = self._spans()
            data = data.result()
        for start, length in spans:
            text = _paragraphs(data[start : start + length].decode("utf-8", errors="replace"))
            if text:
                yield text

    def _spans(self) -> list[tuple[int, int]]:
        """The entries' (offset, length) in the dictionary, in file order, without the database
        info/license entries (``00-...``) and anything before their end."""
        spans, header_end = set(), 0
        for line in self.index.read_text(encoding="utf-8", errors="replace").splitlines():
            parts = line.split("\t")
            if len(parts) < 3:
                continue
            start, length = dictd_number(parts[1]), dictd_number(parts[2])
            if parts[0].startswith("00-"):  # database info/license entries
                header_end = max(header_end, start + length)
            else:
                spans.add((start, length))
        return sorted((s, n) for s, n in spans if s >= header_end)

    def attribution(self) -> dict[str, Any]:
        return {"source": f"Debian package {self.package}", "license": self.license}


def _read_dict(path: Path) -> bytes:
    """The whole dictionary file, inflated when it is ``.dict.dz`` (gzip-compatible)."""
    opener = gzip.open if path.suffix == ".dz" else open
    with opener(path, "rb") as f:
        return f.read()


@register_corpus("dict-gcide", "GNU Collaborative International Dictionary of English (apt)")
def _gcide(options: SourceOptions, root: Path = Path("/")) -> Corpus:
    return DictdCorpus(
        "dict-gcide",
        root / "usr/share/dictd/gcide.index",
        "dict-gcide",
        "GPL-2.0-or-later (GCIDE; from Webster's 1913 and WordNet)",
    )


# -------------------------------------------------------------------------------------- wordnet

WORDNET_FILES = ("data.noun", "data.verb", "data.adj", "data.adv")


def parse_wordnet_line(line: str) -> str | None:
    """One ``data.*`` line -> ``"dog, domestic dog: a member of the genus Canis ..."``."""
    if line.startswith("  ") or " | " not in line:
        return None  # license header, or a synset without a gloss
    head, gloss = line.split(" | ", 1)
    fields = head.split()
    n_words = int(fields[3], 16)
    words = [fields[4 + 2 * i] for i in range(n_words)]
    words = [re.sub(r"\([a-z]+\)$", "", w).replace("_", " ") for w in words]
    return f"{', '.join(words)}: {gloss.strip()}"


class WordNetCorpus(Corpus):
    name = "wordnet"

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def documents(self) -> Iterator[str]:
        paths = [self.directory / f for f in WORDNET_FILES]
        if not all(p.exists() for p in paths):
            raise _missing("wordnet", "wordnet-base", f"{self.directory}/data.noun etc.")
        for path in paths:
            with open(path, encoding="utf-8", errors="replace") as f:
                for line in f:
                    doc = parse_wordnet_line(line)
                    if doc:
                        yield doc

    def attribution(self) -> dict[str, Any]:
        return {
            "source": "WordNet 3.0 (Debian package wordnet-base)",
            "license": "WordNet 3.0 license (Princeton University; permissive, BSD-like)",
        }


@register_corpus("wordnet", "WordNet 3.0 synsets with glosses, one per document (apt)")
def _wordnet(options: SourceOptions, root: Path = Path("/")) -> Corpus:
    return WordNetCorpus(root / "usr/share/wordnet")


# ------------------------------------------------------------------------------------ bible-kjv

_VERSE = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+)\s+(.*)$")


def group_verses(lines: Iterable[str]) -> Iterator[str]:
    """``bible -f`` output (``Ge1:1 In the beginning ...``) -> one document per chapter."""
    key, verses = None, []
    for line in lines:
        m = _VERSE.match(line.strip())
        if not m:
            continue
        chapter = (m.group(1), m.group(2))
        if chapter != key and verses:
            yield "\n".join(verses)
            verses = []
        key = chapter
        verses.append(m.group(4))
    if verses:
        yield "\n".join(verses)


class BibleKJV(Corpus):
    name = "bible-kjv"

    def __init__(self, data_dir: Path | None = None) -> None:
        self.data_dir = data_dir

    def documents(self) -> Iterator[str]:
        exe = shutil.which("bible")
        if exe is None:
            raise _missing("bible-kjv", "bible-kjv", "the `bible` program")
        cmd = [exe, "-f"]
        if self.data_dir is not None:
            cmd += ["-p", str(self.data_dir)]
        out = subprocess.run([*cmd, "Gen1:1-Rev22:21"], capture_output=True, text=True, check=False)
        if out.returncode != 0 or not out.stdout.strip():
            raise UserError(
                f"`bible` failed ({out.stderr.strip()[:200]}); "
                "reinstall with sudo apt-get install --reinstall bible-kjv bible-kjv-text"
            )
        yield from group_verses(out.stdout.splitlines())

    def attribution(self) -> dict[str, Any]:
        return {
            "source": "King James Version (Debian package bible-kjv-text)",
            "license": "public domain (outside the UK)",
        }


@register_corpus("bible-kjv", "King James Bible, one chapter per document (apt)")
def _bible(options: SourceOptions) -> Corpus:
    return BibleKJV()


# ----------------------------------------------------------------------------------- python-doc

_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`~?!?([^`<]*?)(?:\s*<[^>]*>)?`")
_LITERAL = re.compile(r"``([^`]+)``")
_EXPLICIT_MARKUP = re.compile(r"^\s*\.\.(?: .*)?$", re.M)  # directives, comments, link targets
_REFERENCE = re.compile(r"`([^`<]+?)(?:\s*<[^>]*>)?`__?")
_OPTION = re.compile(r"^\s+:[a-z-]+:.*$", re.M)
_UNDERLINE = re.compile(r"^([=\-~^*#\"+'`])\1{3,}\s*$", re.M)


def clean_rst(text: str) -> str:
    """Sphinx reST source -> readable text (roles and directive markers removed)."""
    text = _ROLE.sub(r"\1", text)
    text = _LITERAL.sub(r"\1", text)
    text = _REFERENCE.sub(r"\1", text)
    text = _EXPLICIT_MARKUP.sub("", text)
    text = _OPTION.sub("", text)
    text = _UNDERLINE.sub("", text)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


class PythonDocs(Corpus):
    name = "python-doc"

    def __init__(self, doc_root: Path) -> None:
        self.doc_root = doc_root

    def _sources(self) -> Path:
        candidates = sorted(self.doc_root.glob("python3*/html/_sources"))
        if not candidates:
            raise _missing("python-doc", "python3-doc", f"{self.doc_root}/python3.X/html/_sources")
        return candidates[-1]

    def documents(self) -> Iterator[str]:
        for path in sorted(self._sources().rglob("*.rst.txt")):
            text = clean_rst(path.read_text(encoding="utf-8", errors="replace"))
            if text:
                yield text

    def attribution(self) -> dict[str, Any]:
        return {
            "source": f"Python documentation sources ({self._sources()})",
            "license": "PSF License / Zero-Clause BSD (Python documentation)",
        }


@register_corpus("python-doc", "Python documentation (reST sources), one page per document (apt)")
def _python_doc(options: SourceOptions, root: Path = Path("/")) -> Corpus:
    return PythonDocs(root / "usr/share/doc")
