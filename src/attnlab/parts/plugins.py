"""Loading a researcher's parts from outside the package.

Three ways in, one code path:

- ``plugins = ["my_ideas", "path/to/more_ideas.py"]`` in a config, experiment or probe file
  (a relative path is read from the file's directory);
- ``--plugin my_ideas`` / ``--plugin ./my_ideas.py`` on any command (repeatable);
- the ``attnlab.parts`` entry-point group of an installed package (loaded on first use).

A spec is a dotted module name or a ``.py`` file path (a directory with ``__init__.py`` is
imported as a package). Importing it runs its ``@register(...)`` decorators. Loading is idempotent
per process (the same spec or file is imported once) and is repeated in every process that
validates a config (each torchrun rank, each ``--jobs`` worker), because validation loads the
config's own ``plugins`` list first. A plugin that fails to import, or that registers a name
already taken, is an error naming the plugin: nothing is overwritten silently.

Each loaded plugin is recorded (:class:`PluginRecord`: spec, module, file, SHA-256 of its source
files and of the local helper modules it imports (:mod:`attnlab.parts.identity`), distribution and
version for entry points) for the run manifest; the SHA-256 is what the check cache and a resume
compare. A plugin file, and each local module it imports while it is imported, is read once:
the code runs from those bytes and the SHA-256 is theirs (:mod:`attnlab.parts.checked`), so the
recorded hash is of the code that ran, even if the file changes meanwhile; code that came with a
model folder is imported from the very bytes that were checked against the folder's record
(``load_plugin(path, checked={path: DATA})``). A plugin that calls ``sys.exit()`` while it is imported is
an error naming it (:mod:`attnlab.parts.exits`), never the end of the command.

**A moved plugin.** A run records its plugins by absolute path. When a recorded ``.py`` file (or
package directory) no longer exists, the plugin loaded in this process from another path under
the same module name (``--plugin NEWPATH``: ``my_ideas.py`` for ``my_ideas.py``, the directory
name for a package) stands in for it, and a :class:`PluginWarning` names both paths and both
SHA-256 (the recorded one comes from the run's ``plugins.json``, made known with
:func:`remember`). Without such a plugin the error says to pass ``--plugin NEWPATH``.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import threading
import traceback
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from attnlab.base.consent import check_code_path
from attnlab.base.errors import UserError
from attnlab.base.pathkind import not_a_file
from attnlab.parts.checked import CheckedSource, import_checked, served, spec_of
from attnlab.parts.exits import exit_message, is_exit
from attnlab.parts.identity import Helper, helpers, identity_hash, is_local
from attnlab.parts.source import PartError, registering_as

GROUP = "attnlab.parts"
#: set to 1 to skip the entry points of installed packages (e.g. to get past a broken one)
NO_ENTRY_POINTS_ENV = "ATTNLAB_NO_ENTRY_POINTS"


class PluginError(UserError):
    """A plugin that cannot be found or imported; the message names it and the fix."""


class PluginWarning(UserWarning):
    """A run's plugin is loaded from another file than the one it recorded (it moved)."""


@dataclass(frozen=True)
class PluginRecord:
    """What a run needs to know to find the same plugin again."""

    spec: str
    module: str
    file: str | None
    sha256: str | None
    distribution: str | None = None
    version: str | None = None
    #: the local modules it imports (their changes change ``sha256``)
    helpers: tuple[Helper, ...] = ()

    def to_dict(self) -> dict:
        d = asdict(self)
        d["helpers"] = [asdict(h) for h in self.helpers]
        return d


_loaded: dict[str, PluginRecord] = {}
#: recorded spec of a moved plugin -> the record of the file loaded in its place
_moved: dict[str, PluginRecord] = {}
#: spec -> the record a run wrote of it (``plugins.json``), for the messages about moved plugins
_recorded: dict[str, dict] = {}
_lock = threading.RLock()
_entry_points_loaded = False


def is_path_spec(spec: str) -> bool:
    return spec.endswith(".py") or os.sep in spec or "/" in spec or Path(spec).is_dir()


def resolve_spec(spec: str, base_dir: str | Path | None = None) -> str:
    """A path spec made absolute (relative to ``base_dir``, else the working directory);
    a module name unchanged."""
    spec = str(spec).strip()
    if not spec:
        raise PluginError("an empty plugin name; give a module name or a .py file path")
    if not is_path_spec(spec):
        return spec
    p = Path(spec).expanduser()
    if not p.is_absolute():
        p = Path(base_dir or Path.cwd()) / p
    return str(p.resolve())


def _source_files(module) -> list[Path]:
    f = getattr(module, "__file__", None)
    if not f:
        return []
    path = Path(f)
    if path.name == "__init__.py":
        return sorted(path.parent.rglob("*.py"))
    return [path]


def source_hash(files: list[Path], read: Mapping[Path, bytes] | None = None) -> str | None:
    """SHA-256 over the files' names and bytes (a package: every .py file inside it); ``read``
    holds bytes already read (by resolved path), used instead of reading the file again."""
    if not files:
        return None
    h = hashlib.sha256()
    root = files[0].parent
    read = read or {}
    for f in files:
        h.update(str(f.relative_to(root) if f.is_relative_to(root) else f.name).encode())
        h.update(b"\0")
        data = read.get(Path(f).resolve())
        h.update(data if data is not None else f.read_bytes())
    return h.hexdigest()


def module_name(spec: str) -> str:
    """The name a plugin is matched by when it moves: a file's stem (``my_ideas`` for
    ``.../my_ideas.py``), a package directory's name, or a dotted module name itself."""
    if not is_path_spec(spec):
        return spec
    path = Path(spec)
    return path.parent.name if path.name == "__init__.py" else path.stem


def _module_name_for(path: Path) -> str:
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:10]
    stem = path.stem if path.name != "__init__.py" else path.parent.name
    return f"attnlab_plugin_{stem}_{digest}"


class _Reading(importlib.abc.MetaPathFinder):
    """While a plugin is imported: each local module it imports (:func:`identity.is_local`) is
    read once, run from those bytes and its bytes kept, so its hash is of the code that ran."""

    def __init__(self, read: dict[Path, bytes]) -> None:
        self.read = read

    def find_spec(self, fullname, path=None, target=None):
        if served(fullname):  # checked bytes of a model folder's helper come first
            return None
        try:
            found = importlib.machinery.PathFinder.find_spec(fullname, path)
        except (ImportError, ValueError):
            return None
        origin = getattr(found, "origin", None)
        if found is None or not isinstance(found.loader, importlib.machinery.SourceFileLoader):
            return None
        if not is_local(origin):
            return None
        try:
            data = Path(origin).read_bytes()
        except OSError:
            return None
        self.read[Path(origin).resolve()] = data
        locations = tuple(found.submodule_search_locations or ())
        package = found.submodule_search_locations is not None
        return spec_of(CheckedSource(fullname, origin, data, package, locations))


@contextlib.contextmanager
def _reading(read: dict[Path, bytes]) -> Iterator[None]:
    finder = _Reading(read)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(finder)


def _import(
    spec: str, checked: Mapping[Path, bytes] | None = None, also: Sequence[str] = ()
) -> tuple[Any, list[str], dict[Path, bytes]]:
    """(the imported module, the names that entered ``sys.modules`` while it was imported, the
    bytes each local file it ran was read as: ``checked`` ones as given). The modules ``also``
    are imported right after it, as part of it (a model folder's copies of its helpers)."""
    before = set(sys.modules)
    read: dict[Path, bytes] = dict(checked or {})
    with _reading(read):
        module = _import_module(spec, read)
        with registering_as(spec):
            for name in also:
                importlib.import_module(name)
    return module, [name for name in list(sys.modules) if name not in before], read


def _record(
    spec: str, module, appeared: list[str], read: Mapping[Path, bytes] | None = None, **extra
) -> PluginRecord:
    """The record of ``module``: its files, its helpers and the identity hash over both (of the
    bytes ``read`` where the import kept them: the code that ran)."""
    files = _source_files(module) if module is not None else []
    name = getattr(module, "__name__", "") if module is not None else ""
    base = Path(files[0]).parent if files else None
    own = [(_file_module(name, base, f, module), f) for f in files]
    found = helpers(own, appeared, read)
    return PluginRecord(
        spec=spec,
        module=extra.pop("module", name),
        file=str(files[0]) if files else None,
        sha256=identity_hash(source_hash(files, read), found),
        helpers=found,
        **extra,
    )


def _file_module(name: str, base: Path | None, f: Path, module) -> str:
    """The module name of ``f``, one of ``module``'s files (a package's submodules by path)."""
    if base is None or getattr(module, "__path__", None) is None or not f.is_relative_to(base):
        return name
    rel = f.relative_to(base).with_suffix("").parts
    rel = rel[:-1] if rel and rel[-1] == "__init__" else rel
    return ".".join([name, *rel])


def _import_module(spec: str, read: dict[Path, bytes]) -> object:
    """Import ``spec``; a file (or a package's ``__init__.py``) from its bytes in ``read`` when
    the caller checked them, else from its bytes read once (kept in ``read``)."""
    with registering_as(spec):
        if not is_path_spec(spec):
            return importlib.import_module(spec)
        path = Path(spec)
        if path.is_dir():
            init = path / "__init__.py"
            if not init.is_file():
                raise PluginError(f"plugin directory {spec!r} has no __init__.py; add one")
            path = init
        if not path.is_file():
            raise PluginError(f"plugin file {spec!r} {not_a_file(path)}; check the path")
        if path.suffix != ".py":
            raise PluginError(
                f"plugin file {spec!r} cannot be imported as Python; is it a .py file?"
            )
        name = _module_name_for(path)
        if name in sys.modules:
            return sys.modules[name]
        data = read.get(path.resolve())
        if data is None:
            data = read[path.resolve()] = path.read_bytes()
        package = path.name == "__init__.py"
        locations = (str(path.parent),) if package else ()
        return import_checked(CheckedSource(name, str(path), data, package, locations))


def load_plugin(
    spec: str,
    base_dir: str | Path | None = None,
    *,
    missing: str | None = None,
    checked: Mapping[Path, bytes] | None = None,
    also: Sequence[str] = (),
) -> PluginRecord:
    """Import one plugin (once per process) and return its record.

    A path that does not exist is served by a plugin of the same module name already loaded from
    elsewhere (see the module doc); otherwise it is an error ending in ``missing`` (default: how
    to point at a moved file). ``checked``: bytes the caller checked, by resolved path (the file
    ``spec`` names, its helpers): imported and hashed as they are, never read again; ``also``:
    module names imported right after it as part of it (a helper used only inside ``forward``)."""
    resolved = resolve_spec(spec, base_dir)
    with _lock:
        if resolved in _loaded:
            return _loaded[resolved]
        if is_path_spec(resolved) and not Path(resolved).exists():
            return _stand_in(resolved, missing)
        if is_path_spec(resolved):  # a file inside a model folder being loaded needs consent
            check_code_path(resolved)
        try:
            module, appeared, read = _import(resolved, checked, also)
        except (PluginError, PartError) as e:
            raise PluginError(f"plugin {spec!r}: {e}") from None
        except ModuleNotFoundError as e:
            if not is_path_spec(resolved) and e.name and resolved.startswith(e.name):
                raise PluginError(
                    f"plugin {spec!r} is not an importable module; give a module on sys.path, a "
                    "path to a .py file (e.g. ./my_ideas.py), or install its package"
                ) from None
            raise PluginError(_failed(spec)) from None
        except Exception:
            raise PluginError(_failed(spec)) from None
        except BaseException as e:
            if not is_exit(e):
                raise  # Ctrl-C
            raise PluginError(
                f"plugin {spec!r} failed to import: "
                + exit_message(e, "it was imported (--plugin or plugins = [...])")
            ) from None
        record = _record(resolved, module, appeared, read)
        _loaded[resolved] = record
        return record


def _stand_in(resolved: str, missing: str | None) -> PluginRecord:
    """The loaded plugin that replaces the missing file ``resolved`` (see the module doc)."""
    name = module_name(resolved)
    found = {
        r.spec: r
        for r in _loaded.values()
        if r.distribution is None
        and is_path_spec(r.spec)
        and r.spec != resolved
        and module_name(r.spec) == name
        and Path(r.spec).exists()
    }
    if len(found) > 1:
        raise PluginError(
            f"plugin file {resolved} does not exist, and {len(found)} loaded plugins have its "
            f"module name {name!r} ({', '.join(sorted(found))}); pass only the one that replaces it"
        )
    if not found:
        others = [module_name(r.spec) for r in _loaded.values() if r.distribution is None]
        hint = missing or "if it moved, pass --plugin NEWPATH"
        if others and missing is None:
            hint += (
                f" (plugins are matched by module name: the new file must be named "
                f"{Path(resolved).name}; --plugin gave {', '.join(map(repr, others))})"
            )
        raise PluginError(f"plugin file {resolved} does not exist; {hint}")
    (record,) = found.values()
    _loaded[resolved] = _moved[resolved] = record
    warnings.warn(moved_message(resolved, record), PluginWarning, stacklevel=2)
    return record


def moved_message(old: str, new: PluginRecord) -> str:
    """One sentence: which file stands in for which, with both SHA-256."""
    then = (_recorded.get(old) or {}).get("sha256")
    now = new.sha256
    if not then:
        verdict = "the run recorded no sha256 to compare"
    elif then == now:
        verdict = "the same source"
    else:
        verdict = "a different source: its parts may not compute what was trained"
    return (
        f"plugin {old} does not exist; using {new.spec} instead (same module name "
        f"{module_name(old)!r}); sha256 recorded {(then or '-')[:12]}, now "
        f"{(now or '-')[:12]} ({verdict})"
    )


def remember(records: list[dict]) -> None:
    """Make a run's recorded plugins (its ``plugins.json``) known, so that a moved one is
    reported with the SHA-256 it had when the run was made."""
    for rec in records:
        if isinstance(rec, dict) and isinstance(rec.get("spec"), str):
            _recorded[rec["spec"]] = rec


def current_spec(spec: str) -> str:
    """The spec the loader uses for ``spec`` now: the stand-in's path for a moved plugin file
    (found as :func:`load_plugin` finds it), else ``spec`` itself. Imports nothing new."""
    with _lock:
        if spec in _loaded:
            return _loaded[spec].spec
        if is_path_spec(spec) and not Path(spec).exists():
            try:
                return _stand_in(spec, None).spec
            except PluginError:
                return spec
    return spec


def _failed(spec: str) -> str:
    """The plugin's own error: its frames (file:line and code) and the exception, without the
    import machinery's frames."""
    etype, err, tb = sys.exc_info()
    frames = [
        f
        for f in traceback.extract_tb(tb)
        if "importlib" not in f.filename and "/attnlab/" not in f.filename
    ]
    where = "".join(f"\n    {f.filename}:{f.lineno}: {(f.line or '').strip()}" for f in frames[-4:])
    name = etype.__name__ if etype else "error"
    return f"plugin {spec!r} failed to import; fix the error it raised:{where}\n    {name}: {err}"


def load_plugins(
    specs: list[str] | tuple[str, ...],
    base_dir: str | Path | None = None,
    *,
    missing: str | None = None,
) -> list[str]:
    """Load every spec; returns the resolved specs (what a config records)."""
    return [load_plugin(s, base_dir, missing=missing).spec for s in specs]


def load_entry_points() -> None:
    """Import every module advertised in the ``attnlab.parts`` entry-point group (once)."""
    global _entry_points_loaded
    if _entry_points_loaded or os.environ.get(NO_ENTRY_POINTS_ENV) == "1":
        _entry_points_loaded = True
        return
    _entry_points_loaded = True
    for ep in metadata.entry_points(group=GROUP):
        dist = ep.dist.name if ep.dist is not None else None
        version = ep.dist.version if ep.dist is not None else None
        label = f"entry point {ep.name!r} ({ep.value}) of {dist or 'an installed package'}"
        with _lock:
            if f"ep:{ep.value}" in _loaded:
                continue
            skip = f"\n  (set {NO_ENTRY_POINTS_ENV}=1 to skip installed plugins)"
            before = set(sys.modules)
            try:
                with registering_as(f"{dist or ep.module}:{ep.name}"):
                    obj = ep.load()
                    if callable(obj) and not isinstance(obj, type):
                        obj()
            except PartError as e:
                raise PluginError(f"{label}: {e}") from None
            except Exception:
                raise PluginError(_failed(label) + skip) from None
            except BaseException as e:
                if not is_exit(e):
                    raise
                raise PluginError(f"{label}: {exit_message(e, 'it was loaded')}{skip}") from None
            appeared = [name for name in list(sys.modules) if name not in before]
            _loaded[f"ep:{ep.value}"] = _record(
                f"ep:{ep.value}",
                sys.modules.get(ep.module),
                appeared,
                module=ep.module,
                distribution=dist,
                version=version,
            )


def loaded() -> list[PluginRecord]:
    """Every plugin loaded in this process (entry points included), once each."""
    return list(dict.fromkeys(_loaded.values()))


def manifest(specs: list[str]) -> list[dict]:
    """What a run records of its plugins: one :class:`PluginRecord` per spec it names (loaded
    here if need be), and every installed entry-point plugin (distribution and version)."""
    out = [load_plugin(spec).to_dict() for spec in specs]
    out += [r.to_dict() for r in _loaded.values() if r.distribution is not None]
    return out


def record_of(source: str) -> PluginRecord | None:
    """The record of the plugin loaded as ``source`` (the source a part registered under)."""
    return _loaded.get(source)


def moved_here(spec: str) -> PluginRecord | None:
    """The plugin loaded in place of recorded ``spec`` that moved (``--plugin NEWPATH``), or
    None."""
    return _moved.get(spec)
