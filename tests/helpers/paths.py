"""Where the repository's files are, for every test: computed here once, never from a test's own
location, so a test file moves between the folders of tests/ without its paths changing."""

from __future__ import annotations

from pathlib import Path

#: the repository root (pyproject.toml, README.md)
ROOT = Path(__file__).resolve().parents[2]
#: the source root on PYTHONPATH for child processes (``src``, holding ``attnlab``)
SRC = ROOT / "src"
#: attnlab's sources in this checkout
PACKAGE = SRC / "attnlab"
DOCS = ROOT / "docs"
EXAMPLES = ROOT / "examples"
BENCHMARKS = ROOT / "benchmarks"
CONFIGS = ROOT / "configs"
#: the suite's data files (eval items, an old run directory)
FIXTURES = ROOT / "tests" / "fixtures"
#: this folder: the helper modules, and scripts run in child processes (``cli_driver.py``)
HELPERS = Path(__file__).resolve().parent
