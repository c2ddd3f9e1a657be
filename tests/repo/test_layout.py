"""The suite's layout (docs/ARCHITECTURE.md, "Where a test goes"): every test module sits in the
folder of the package of src/attnlab it tests (or in one of the few other folders named below),
every package has a test in the fast tier (``make test-fast``), and the shared helpers are
imported from the ``tests.helpers`` package, never by bare module name."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.helpers.paths import HELPERS, PACKAGE, ROOT

pytestmark = pytest.mark.fast  # the whole module is in the fast tier (make test-fast)

TESTS = ROOT / "tests"
#: folders of tests/ that are no package of src/attnlab
OTHER = {
    "gpu": "the gpu-marked tests and benchmarks/gpu_h100.sh's dry run",
    "repo": "repository-wide rules: import layers, function length, docs, lean install, layout",
    "helpers": "modules the tests share (tests.helpers.X), no tests",
    "fixtures": "data files, no Python",
}
#: the config layer, a module (config.py) until it is a package: its tests are tests/config/
MODULES = {"config"}


def packages() -> list[str]:
    """The packages of src/attnlab (folders with an ``__init__.py``)."""
    return sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))


def in_fast_tier(path: Path) -> bool:
    """Whether a test module marks anything ``pytest.mark.fast`` (a test, a parameter or the
    module's ``pytestmark``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(
        isinstance(node, ast.Attribute)
        and node.attr == "fast"
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "mark"
        for node in ast.walk(tree)
    )


def test_no_test_module_sits_at_the_top_of_tests():
    loose = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert loose == [], (
        f"{', '.join(loose)}: move each into the folder of the package it tests "
        "(git mv tests/test_x.py tests/<package>/test_x.py); docs/ARCHITECTURE.md#where-a-test-goes"
    )


def test_every_folder_is_a_package_of_src_or_a_named_other():
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and p.name[0] not in "._"}
    strange = sorted(folders - set(packages()) - MODULES - set(OTHER))
    assert strange == [], (
        f"tests/{', tests/'.join(strange)}: no package of src/attnlab has this name; put its tests "
        "in the folder of the package they test, or name the folder in OTHER with its reason"
    )
    no_init = sorted(
        str(p.parent.relative_to(TESTS))
        for p in TESTS.rglob("test_*.py")
        if not (p.parent / "__init__.py").is_file()
    )
    assert no_init == [], f"add an __init__.py to tests/{', tests/'.join(no_init)}"


def test_every_package_has_a_test_in_the_fast_tier():
    """``make test-fast`` touches every package: a package without a fast test (a new one, or
    one whose marked test moved) fails here, naming it."""
    missing = [
        name
        for name in sorted({*packages(), *MODULES})
        if not any(in_fast_tier(f) for f in (TESTS / name).glob("test_*.py"))
    ]
    assert missing == [], (
        f"no test of {', '.join(missing)} is in the fast tier: mark a test of tests/<package>/ "
        "that takes about a second with @pytest.mark.fast"
    )


def test_the_scan_sees_each_way_of_marking(tmp_path: Path):
    cases = {
        "@pytest.mark.fast\ndef test_a():\n    pass\n": True,
        "pytestmark = pytest.mark.fast\n": True,
        "pytestmark = [pytest.mark.fast, pytest.mark.gpu]\n": True,
        "ids = [pytest.param(1, marks=pytest.mark.fast)]\n": True,
        "@pytest.mark.slow\ndef test_fast():\n    pass\n": False,
    }
    for text, expected in cases.items():
        (tmp_path / "test_x.py").write_text(f"import pytest\n\n{text}")
        assert in_fast_tier(tmp_path / "test_x.py") is expected, text


def test_helpers_and_test_modules_are_imported_by_their_package_path():
    """``from tests.helpers.data import ...``, ``from tests.model.test_variants import ...``:
    never a bare module name, which only resolved when tests/ was one flat folder."""
    names = {p.stem for p in HELPERS.glob("*.py") if p.stem != "__init__"}
    bare = re.compile(rf"^\s*(?:from|import) ({'|'.join(sorted(names))}|test_\w+)\b", re.M)
    offenders = [
        f"{p.relative_to(TESTS)}: {m.group(0).strip()}"
        for p in sorted(TESTS.rglob("*.py"))
        for m in bare.finditer(p.read_text(encoding="utf-8"))
    ]
    assert offenders == [], "import them as tests.<folder>.<module>:\n" + "\n".join(offenders)


def test_no_test_computes_a_path_from_its_own_location():
    """Paths come from tests/helpers/paths.py (ROOT, SRC, PACKAGE, DOCS, EXAMPLES, FIXTURES,
    ...): ``Path(__file__).parents[1]`` meant the repository root only while tests/ was flat, and
    breaks when a test moves between folders. ``__file__`` inside a string (a plugin a test
    writes) is that file's own and is not counted."""
    offenders = [
        f"{p.relative_to(TESTS)}:{node.lineno}"
        for p in sorted(TESTS.rglob("*.py"))
        if p != HELPERS / "paths.py"
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
        if isinstance(node, ast.Name) and node.id == "__file__"
    ]
    assert offenders == [], f"use tests.helpers.paths instead of __file__ at {offenders}"
