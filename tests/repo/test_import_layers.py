"""No import circle anywhere in attnlab, packages import only the layers below them, and
experiments/ keeps its own layers.

The import graph is read from the sources (every ``import``, also inside functions and under
``TYPE_CHECKING``): module A -> module B when A imports B or a name from B. A circle is a strongly
connected component of more than one module; there is none. The layers (docs/CONTRACTS.md) run
base <- config, recipe, parts <- model <- data <- runs <- train, probe, eval, hf, bench, testing,
quant <- experiments <- commands, cli.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import attnlab

pytestmark = pytest.mark.fast  # the whole module is in the fast tier (make test-fast)

SRC = Path(attnlab.__file__).parent

#: the package's layers, from the bottom up (a top-level name -> its layer)
LAYERS = [
    ["base"],
    ["config", "recipe", "parts"],
    ["model"],
    ["data"],
    ["runs"],
    ["train", "probe", "eval", "hf", "bench", "testing", "quant"],
    ["experiments", "inspection"],
    ["commands", "cli", "__main__"],
]
#: the imports that reach up: the part and family registries import their built-in members
#: (the packages attnlab.model.parts and attnlab.model.families, by name, on their first
#: lookup), as every registry loads its members
UPWARD = {
    ("attnlab.parts.registry", "attnlab.model.parts"),
    ("attnlab.parts.families", "attnlab.model.families"),
}
#: modules at the package root (each with its reason in docs/CONTRACTS.md)
ROOT_MODULES = {"__init__", "__main__", "cli", "recipe"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        parts = ["attnlab", *path.relative_to(SRC).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """attnlab module -> the attnlab modules it imports (a package's ``__init__`` importing its
    own members, and a module importing its parent packages, do not count)."""
    mods = _modules()

    def owner(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        pkg = mod if is_pkg else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                names = [base, *(f"{base}.{a.name}" for a in node.names)]
            else:
                continue
            for name in names:
                target = owner(name)
                if target is None or target == mod or mod.startswith(target + "."):
                    continue
                if is_pkg and target.startswith(mod + "."):
                    continue
                graph[mod].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return out


def test_the_circle_finder_finds_a_circle_and_only_circles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [{"a", "b", "c"}]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle():
    found = circles(import_graph())
    assert not found, "import circles: " + "; ".join(" <-> ".join(sorted(c)) for c in found)


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_package_has_a_layer():
    names = {n for layer in LAYERS for n in layer}
    assert sorted({_top(m) for m in _modules()} - names - {"__init__"}) == []


def test_packages_import_only_the_layers_below_them():
    rank = {name: i for i, layer in enumerate(LAYERS) for name in layer}
    up = []
    for mod, targets in import_graph().items():
        for t in sorted(targets):
            a, b = _top(mod), _top(t)
            if a in rank and b in rank and rank[b] > rank[a] and (mod, t) not in UPWARD:
                up.append(f"{mod} ({a}) imports {t} ({b})")
    assert up == []


def test_the_package_root_holds_only_the_listed_modules():
    root = {p.stem for p in SRC.glob("*.py")}
    assert root == ROOT_MODULES, sorted(root ^ ROOT_MODULES)


# --------------------------------------------------------------------------- experiments/

EXP = "attnlab.experiments"
#: experiments/ from the bottom up: a layer imports only layers below it (or itself)
EXPERIMENT_LAYERS = [
    ("definition", ["spec", "sweep_spec", "matching", "resolve", "record", "results"]),
    ("sweeps", ["sweeps"]),
    ("running", ["running"]),
    ("reports", ["reports"]),
    ("load", ["load"]),
    ("compare", ["compare"]),
]
#: side by side: neither imports the other
SIBLINGS = {("running", "reports"), ("reports", "running")}


def _layer(module: str) -> str | None:
    rest = module.removeprefix(EXP + ".")
    for name, members in EXPERIMENT_LAYERS:
        if any(rest == m or rest.startswith(m + ".") for m in members):
            return name
    return None


def test_every_experiments_module_has_a_layer():
    mods = [m for m in _modules() if m.startswith(EXP + ".")]
    assert mods and [m for m in mods if _layer(m) is None] == []


def test_experiments_imports_go_one_way():
    order = [name for name, _ in EXPERIMENT_LAYERS]
    bad = []
    for mod, targets in import_graph().items():
        here = _layer(mod) if mod.startswith(EXP + ".") else None
        if here is None:
            continue
        for t in sorted(targets):
            there = _layer(t) if t.startswith(EXP + ".") else None
            if there is None or there == here:
                continue
            if (here, there) in SIBLINGS or order.index(there) > order.index(here):
                bad.append(f"{mod} ({here}) imports {t} ({there})")
    assert bad == []


@pytest.mark.parametrize("name", ["build_report", "load_experiment", "run_all"])
def test_the_public_entry_points_stay_where_the_cli_finds_them(name):
    import attnlab.experiments

    assert callable(getattr(attnlab.experiments, name))
