"""The run engine sits below the protocols, evaluation does not import the probe, and the data
registries load their members without import circles."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import attnlab

SRC = Path(attnlab.__file__).parent


def _imports(package: str) -> dict[str, set[str]]:
    """``attnlab.*`` modules each file of ``package`` imports (top level or inside functions)."""
    out = {}
    for path in sorted((SRC / package).rglob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)  # and each name, which may be a module itself
                names.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
        out[str(path.relative_to(SRC))] = {n for n in names if n.startswith("attnlab")}
    return out


def _offenders(package: str, forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{file} imports {name}"
        for file, names in _imports(package).items()
        for name in sorted(names)
        if any(name == f or name.startswith(f + ".") for f in forbidden)
    ]


def test_eval_imports_neither_probe_nor_the_trainer():
    assert _offenders("eval", ("attnlab.probe", "attnlab.train")) == []


@pytest.mark.fast
def test_the_engine_imports_no_protocol():
    protocols = ("attnlab.train", "attnlab.probe", "attnlab.eval", "attnlab.bench")
    more = ("attnlab.experiments", "attnlab.commands", "attnlab.cli")
    assert _offenders("runs", protocols + more) == []


def test_importing_eval_loads_no_probe_or_trainer_module():
    code = (
        "import sys, attnlab.eval, attnlab.eval.targets; "
        "print(sorted(m for m in sys.modules if m.startswith(('attnlab.probe', 'attnlab.train'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _circles(package: str) -> list[list[str]]:
    """Import circles (strongly connected components) among the modules of ``package``; an
    import names its longest module (``attnlab.data.corpus``, not the package ``attnlab.data``)."""
    modules = {
        "attnlab." + f.removesuffix(".py").removesuffix("/__init__").replace("/", "."): names
        for f, names in _imports(package).items()
    }

    def module_of(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {
        m: {n for i in names if (n := module_of(i)) and n != m and not m.startswith(n + ".")}
        for m, names in modules.items()
    }

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for n in graph[todo.pop()] - seen:
                seen.add(n)
                todo.append(n)
        return seen

    reachable = {m: reach(m) for m in graph}
    circles = {frozenset({m} | {n for n in reachable[m] if m in reachable[n]}) for m in graph}
    return sorted(sorted(c) for c in circles if len(c) > 1)


def test_data_modules_form_no_import_circle():
    """The tokenizer and corpus lookups import their members; the members import only the
    interfaces (``data.tokenizer``, ``data.corpus``), never the lookups."""
    assert _circles("data") == []
