"""The documentation stays true to the repository: every local link and anchor of the README,
docs/ and benchmarks/ resolves, every recorded result a document names exists, and the README's
command table and docs/commands.md cover exactly the commands ``attnlab --help`` shows (so a new
command cannot go undocumented)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from attnlab.cli import build_parser
from tests.helpers.paths import ROOT

pytestmark = pytest.mark.fast  # the whole module is in the fast tier (make test-fast)

README = ROOT / "README.md"
COMMANDS = ROOT / "docs" / "commands.md"
#: every Markdown file whose links are checked
DOCS = [
    README,
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "docs" / "results").glob("*/README.md")),
    ROOT / "benchmarks" / "README.md",
    ROOT / "benchmarks" / "FINDINGS.md",
    ROOT / "benchmarks" / "results" / "README.md",
]

FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose(path: Path) -> list[str]:
    """The lines of a Markdown file outside fenced code blocks."""
    out, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor of a Markdown file's headings (a repeated heading gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(path):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def _links(path: Path) -> list[str]:
    return [t for line in _prose(path) for t in LINK.findall(line)]


def test_the_slug_is_githubs():
    assert slug("`attnlab params`") == "attnlab-params"
    assert slug("Run engine (`attnlab.runs`, shared by train, probe)") == (
        "run-engine-attnlabruns-shared-by-train-probe"
    )
    assert slug("A run's plugins, and a plugin file that moved") == (
        "a-runs-plugins-and-a-plugin-file-that-moved"
    )


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_local_link_and_anchor_resolves(doc: Path):
    assert doc.is_file(), doc
    bad = []
    for target in _links(doc):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading with that anchor in {dest.relative_to(ROOT)}")
    assert not bad, bad


def test_every_named_result_file_exists():
    """A recorded benchmark result a document names (``benchmarks/results/NAME.md``, or
    ``results/NAME.json`` beside benchmarks/README.md) is in the repository: superseded runs leave
    through git history, and the documents that cite them must say so."""
    pattern = re.compile(r"(?<![\w/.:-])((?:benchmarks/)?results/[\w.-]+\.(?:md|json))\b")
    missing = []
    for doc in DOCS:
        for name in pattern.findall(doc.read_text(encoding="utf-8")):
            base = ROOT if name.startswith("benchmarks/") else doc.parent
            if not (base / name).exists():
                missing.append(f"{doc.relative_to(ROOT)}: {name}")
    assert not missing, missing


def _cli_commands() -> set[str]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return set(sub.choices)


def test_the_readme_lists_every_command():
    listed = set(
        re.findall(
            r"^\|\s*\[`attnlab ([a-z-]+)`\]\(docs/commands\.md#attnlab-\1\)",
            README.read_text(encoding="utf-8"),
            re.M,
        )
    )
    commands = _cli_commands()
    assert len(commands) >= 12, commands
    assert listed == commands, (
        f"not in the README's command table: {sorted(commands - listed)}; "
        f"in it but not a command: {sorted(listed - commands)}"
    )


def test_the_command_reference_has_a_section_per_command():
    sections = {a.removeprefix("attnlab-") for a in anchors(COMMANDS) if a.startswith("attnlab-")}
    missing = _cli_commands() - sections
    assert not missing, f"docs/commands.md has no '## attnlab NAME' section for {sorted(missing)}"


def test_the_readme_stays_a_door():
    """The README is the way in (two commands, a variant, the run directory, exit codes, the
    command table); the reference lives in docs/commands.md."""
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= 400, f"README.md has {lines} lines; move reference material to docs/"
