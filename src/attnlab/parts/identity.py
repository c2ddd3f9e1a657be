"""What a plugin is made of: its own source files and the local modules it imports (its
helpers), hashed into one SHA-256, so that a changed helper is a changed plugin for the check
cache (:mod:`attnlab.testing.cache`) and for a resume (``plugins.json``).

A module is *local* when its ``.py`` source lies outside Python's standard library, outside every
site-packages directory and outside attnlab itself: the researcher's own code. A plugin's helpers
are found two ways, and their union is recorded:

- **at import**: the local modules that appeared in ``sys.modules`` while the plugin was imported
  (a sibling file put on ``sys.path``, a module loaded by name computed at run time);
- **by reading the sources**: every ``import`` statement of the plugin's files and of each helper
  found so far (also inside functions, so a lazy ``import helper`` in ``forward`` counts), absolute
  and relative, resolved without importing anything (``importlib.machinery.PathFinder``) and kept
  when it resolves to a local file.

A helper is recorded by module name and SHA-256 of its bytes (the bytes it ran from, where the
plugin loader kept them: :mod:`attnlab.parts.checked`); the plugin's identity is its own
source hash when it has no helper (the same hash earlier versions recorded), else the SHA-256 of
that and every helper's name and hash. Not seen: a module imported later under a name that is
computed at run time, and files a plugin reads as data.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import importlib.machinery
import site
import sys
import sysconfig
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

#: attnlab's own package directory (its modules are never a plugin's helpers)
ATTNLAB_DIR = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Helper:
    """A local module a plugin imports: its module name, its file and the SHA-256 of its bytes."""

    module: str
    file: str
    sha256: str


@functools.lru_cache(maxsize=1)
def excluded_roots() -> tuple[Path, ...]:
    """Directories whose modules are not the researcher's: the standard library, every
    site-packages directory, and attnlab."""
    paths = sysconfig.get_paths()
    roots = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    with contextlib.suppress(AttributeError):  # a virtualenv's old site.py
        roots.update(site.getsitepackages())
    roots.add(site.getusersitepackages())
    out = {ATTNLAB_DIR}
    for r in roots:
        if r:
            try:
                out.add(Path(r).resolve())
            except OSError:
                continue
    return tuple(sorted(out))


def is_local(path: str | Path | None) -> bool:
    """Whether ``path`` is a ``.py`` source outside the standard library, site-packages and
    attnlab."""
    if not path or not str(path).endswith(".py"):
        return False
    try:
        p = Path(path).resolve()
    except OSError:
        return False
    return not any(p.is_relative_to(root) for root in excluded_roots())


def module_file(module: object) -> Path | None:
    """The ``.py`` source of an imported module (None: built-in, frozen, compiled only)."""
    f = getattr(module, "__file__", None)
    return Path(f).resolve() if isinstance(f, str) and f.endswith(".py") else None


def _find(name: str) -> Path | None:
    """The ``.py`` file module ``name`` is (or would be) imported from, without importing it."""
    if not name or name == "__main__":
        return None
    mod = sys.modules.get(name)
    if mod is not None:
        return module_file(mod)
    parent = name.rpartition(".")[0]
    try:
        if parent:
            search = getattr(sys.modules.get(parent), "__path__", None)
            if search is None:
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, list(search))
        else:
            spec = importlib.machinery.PathFinder.find_spec(name)
    except (ImportError, ValueError, OSError):
        return None
    origin = getattr(spec, "origin", None)
    return Path(origin).resolve() if isinstance(origin, str) and origin.endswith(".py") else None


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def imported_names(path: Path, module: str, data: bytes | None = None) -> set[str]:
    """Every module name the ``import`` statements of ``path`` (module ``module``; its bytes
    ``data`` when already read) may load."""
    try:
        tree = ast.parse(data if data is not None else path.read_bytes())
    except (OSError, SyntaxError, ValueError):
        return set()
    package = _package_of(module, path)
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                names.update(".".join(parts[: i + 1]) for i in range(len(parts)))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".") if package else []
                if node.level - 1 > len(anchor) or not package:
                    continue
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            if base:
                names.add(base)
                names.update(f"{base}.{a.name}" for a in node.names if a.name != "*")
    return names


def helpers(
    own: Iterable[tuple[str, Path]],
    appeared: Iterable[str] = (),
    read: Mapping[Path, bytes] | None = None,
) -> tuple[Helper, ...]:
    """The local modules that the files ``own`` ((module name, file) of the plugin itself)
    import, directly or through each other, plus the local modules of ``appeared`` (the names
    that entered ``sys.modules`` during its import); sorted by module name. ``read``: the bytes
    files were imported from (by resolved path), hashed instead of the files read again."""
    read = read or {}
    own = [(name, Path(f).resolve()) for name, f in own]
    own_files = {f for _, f in own}
    found: dict[Path, str] = {}
    todo = list(own)
    for name in appeared:
        f = module_file(sys.modules.get(name))
        if f is not None and is_local(f) and f not in own_files and f not in found:
            found[f] = name
            todo.append((name, f))
    while todo:
        name, f = todo.pop()
        for target in sorted(imported_names(f, name, read.get(f))):
            path = _find(target)
            if path is None or path in own_files or path in found or not is_local(path):
                continue
            found[path] = target
            todo.append((target, path))
    out = [
        Helper(module=name, file=str(path), sha256=_file_hash(path, read.get(path)))
        for path, name in found.items()
        if path in read or path.is_file()
    ]
    return tuple(sorted(out, key=lambda h: (h.module, h.file)))


def _file_hash(path: Path, data: bytes | None = None) -> str:
    return hashlib.sha256(data if data is not None else path.read_bytes()).hexdigest()


def identity_hash(own: str | None, found: Iterable[Helper]) -> str | None:
    """The plugin's SHA-256: ``own`` (its own files' hash) alone when it has no helper, else one
    hash over it and each helper's module name and SHA-256 (names, not paths: a plugin that moves
    with its helpers keeps its identity)."""
    found = sorted(found, key=lambda h: h.module)
    if not found:
        return own
    h = hashlib.sha256((own or "").encode())
    for helper in found:
        h.update(b"\0helper\0" + helper.module.encode() + b"\0" + helper.sha256.encode())
    return h.hexdigest()


def helper_changes(recorded: object, now: Iterable[Helper]) -> list[str]:
    """Sentences naming each helper that differs between a recorded list (``plugins.json``'s
    ``helpers``: dicts with module, file, sha256) and the helpers loaded ``now``."""
    if not isinstance(recorded, list):
        return []
    then = {
        str(r.get("module")): r
        for r in recorded
        if isinstance(r, dict) and isinstance(r.get("module"), str)
    }
    current = {h.module: h for h in now}
    out = []
    for name in sorted(set(then) | set(current)):
        old, new = then.get(name), current.get(name)
        if old is None and new is not None:
            out.append(f"helper {new.file} (module {name}) is new")
        elif new is None and old is not None:
            out.append(f"helper {old.get('file')} (module {name}) is no longer imported")
        elif old is not None and new is not None and old.get("sha256") != new.sha256:
            out.append(
                f"helper {new.file} (module {name}) changed: sha256 "
                f"{str(old.get('sha256'))[:12]} then, {new.sha256[:12]} now"
            )
    return out
