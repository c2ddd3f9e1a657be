"""Copy attnlab's model sources, flattened, into a Hugging Face remote-code folder.

transformers runs a folder's own code (``trust_remote_code=True``) by copying the module that
``auto_map`` names, and every module it imports relatively (``from .name import ...``), side by
side into one package directory. So an exported folder carries attnlab's real model sources, not a
re-implementation: every module the modeling code needs is copied with its ``attnlab.*`` imports
rewritten as relative imports of flat names (``attnlab.model.block`` ->
``attnlab_model_block.py``), and so are the modules of the run's plugins and the local helper
modules they import (:attr:`PluginModule.helpers`, flat as ``attnlab_plugin_NAME.py``, their
imports rewritten the same way), so the folder loads where the plugin's own directory is gone.
Two modules are written rather than copied:

- ``attnlab.model.parts`` and ``attnlab.model.families``: a flat copy cannot be listed like a
  package, so each names its modules in ``PART_MODULES`` / ``FAMILY_MODULES`` (read by
  :func:`attnlab.parts.registry._builtin_modules` and
  :func:`attnlab.parts.families._builtin_modules`);
- ``attnlab.hf.export_plugins``: it imports the copied plugin modules and their helpers, which
  registers their parts, each only after checking that its file holds the code exported (SHA-256,
  recorded in the module and in config.json's ``attnlab_plugins`` as ``flat_sha256``), and from
  the very bytes it checked (:mod:`attnlab.parts.checked`, copied too): transformers' consent
  (``trust_remote_code=True``) is to run the folder as exported, not whatever it holds later.

Everything else is byte for byte the installed source except the rewritten import statements.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import keyword
import re
from dataclasses import dataclass, field
from pathlib import Path

from attnlab.base.errors import UserError

#: modules whose flat names follow transformers' conventions
SPECIAL_NAMES = {
    "attnlab.hf.configuration": "configuration_attnlab",
    "attnlab.hf.modeling": "modeling_attnlab",
}
PARTS_PACKAGE = "attnlab.model.parts"
#: packages whose modules a registry imports by listing them -> the name of the flat list
LISTED_PACKAGES = {PARTS_PACKAGE: "PART_MODULES", "attnlab.model.families": "FAMILY_MODULES"}
PLUGINS_MODULE = "attnlab.hf.export_plugins"
#: what the written plugins module imports its checked files with
CHECKED_MODULE = "attnlab.parts.checked"
ROOTS = ("attnlab.hf.modeling", "attnlab.hf.configuration")


class VendorError(UserError):
    """A source that cannot be flattened (the message names the file, the line and the fix)."""


@dataclass(frozen=True)
class PluginModule:
    """A module of the run's plugins to copy: its parts (slot, kind, class) and where it came from."""

    module: str
    spec: str
    parts: tuple[tuple[str, str, str], ...]
    #: the local modules it imports (:attr:`attnlab.parts.plugins.PluginRecord.helpers`)
    helpers: tuple[str, ...] = ()


@dataclass
class Vendored:
    """The flat sources: file name -> text, and module -> flat name."""

    files: dict[str, str] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)
    #: flat name of each copied plugin (or helper) module -> SHA-256 of its file's UTF-8 bytes
    plugin_sha256: dict[str, str] = field(default_factory=dict)

    def write(self, folder: Path) -> list[str]:
        for name, text in self.files.items():
            (folder / name).write_bytes(text.encode("utf-8"))  # the bytes that were hashed
        return sorted(self.files)


def _spec(module: str):
    try:
        return importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None


def _is_module(name: str) -> bool:
    return _spec(name) is not None


def _source(module: str) -> tuple[Path, bool]:
    spec = _spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise VendorError(f"module {module!r} has no Python source to copy into the export")
    return Path(spec.origin), spec.submodule_search_locations is not None


def _identifier(text: str) -> str:
    out = re.sub(r"\W", "_", text)
    return out if out.isidentifier() and not keyword.iskeyword(out) else f"m_{out}"


class _Flattener:
    def __init__(self, roots: set[str], names: dict[str, str]) -> None:
        self.roots = roots  # top-level packages whose modules are copied
        self.names = names  # module -> flat name (filled as modules are found)

    def inside(self, module: str) -> bool:
        return module.split(".")[0] in self.roots

    def flat(self, module: str) -> str:
        if module not in self.names:
            name = SPECIAL_NAMES.get(module)
            if name is None:
                # a plugin file's module name ends in a digest of its path (parts.plugins)
                base = _identifier(re.sub(r"_[0-9a-f]{10}$", "", module).replace(".", "_"))
                if not base.startswith("attnlab"):
                    base = f"attnlab_plugin_{base}"
                name, i = base, 2
                while name in self.names.values():
                    name, i = f"{base}_{i}", i + 1
            self.names[module] = name
        return self.names[module]

    def rewrite(self, module: str, path: Path, is_pkg: bool) -> tuple[str, list[str]]:
        """The flat source of ``module`` and the modules it imports from the copied packages."""
        data = path.read_bytes()
        tree = ast.parse(data, filename=str(path))
        line_starts = [0]
        for line in data.splitlines(keepends=True):
            line_starts.append(line_starts[-1] + len(line))
        edits: list[tuple[int, int, bytes]] = []
        deps: list[str] = []
        package = module if is_pkg else module.rpartition(".")[0]
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            stmts = self._statement(node, package, deps, path)
            if stmts is None:
                continue
            start = line_starts[node.lineno - 1] + node.col_offset
            end = line_starts[node.end_lineno - 1] + node.end_col_offset
            line_prefix = data[line_starts[node.lineno - 1] : start]
            sep = "\n" + line_prefix.decode() if not line_prefix.strip() else "; "
            edits.append((start, end, sep.join(stmts).encode()))
        for start, end, text in sorted(edits, reverse=True):
            data = data[:start] + text + data[end:]
        text = data.decode("utf-8")
        bound = sorted({m for m in re.findall(r"from \. import (\w+) as", text)})
        if bound:  # `from . import M` is not followed by transformers; name M where it looks
            text += (
                "\n\nif False:  # attnlab export: transformers copies the modules imported as\n"
                "    # `from .NAME import ...`; these are bound with `from . import NAME` above\n"
                + "".join(f"    from .{m} import *  # noqa: F403\n" for m in bound)
            )
        return text, deps

    def _statement(
        self, node: ast.Import | ast.ImportFrom, package: str, deps: list[str], path: Path
    ) -> list[str] | None:
        where = f"{path}:{node.lineno}"
        if isinstance(node, ast.Import):
            mods = [a for a in node.names if self.inside(a.name)]
            if not mods:
                return None
            bare = [a for a in mods if a.asname is None and "." in a.name]
            if len(mods) != len(node.names) or bare:
                raise VendorError(
                    f"{where}: `import {', '.join(a.name for a in node.names)}` binds a package "
                    "name the flat copy does not have; write `from PACKAGE import NAME` or "
                    "`import MODULE as NAME`"
                )
            deps.extend(a.name for a in mods)
            return [f"from . import {self.flat(a.name)} as {a.asname or a.name}" for a in mods]
        if node.level:
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - (node.level - 1)])
            target = f"{base}.{node.module}" if node.module else base
        else:
            target = node.module or ""
        if not self.inside(target):
            return None
        subs, names = [], []
        for a in node.names:
            if a.name != "*" and _is_module(f"{target}.{a.name}"):
                subs.append(a)
            else:
                names.append(a)
        out = []
        if names:
            if target == "attnlab":
                raise VendorError(
                    f"{where}: names from the top-level attnlab package cannot be copied; import "
                    "them from the module that defines them"
                )
            deps.append(target)
            listed = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in names)
            out.append(f"from .{self.flat(target)} import {listed}")
        for a in subs:
            sub = f"{target}.{a.name}"
            deps.append(sub)
            out.append(f"from . import {self.flat(sub)} as {a.asname or a.name}")
        return out


def _header(module: str, path: Path) -> str:
    return (
        f"# {module} ({path.name}), copied by `attnlab export`: the source as installed, with its\n"
        "# attnlab imports made relative to this folder.\n"
    )


def _listed_package(flat: _Flattener, package: str, modules: list[str]) -> str:
    """The flat stand-in of ``package`` (the built-in parts or families): the list of its
    modules a registry imports, under the name of :data:`LISTED_PACKAGES`."""
    names = [flat.flat(m) for m in modules]
    listed = "".join(f"    {n!r},\n" for n in names)
    imports = "".join(f"    from .{n} import *  # noqa: F403\n" for n in names)
    constant = LISTED_PACKAGES[package]
    return (
        f'"""The modules of {package}, one idea each (written by `attnlab export`).\n\n'
        "A flat copy cannot be listed like a package, so the registry imports the modules named\n"
        f'in {constant}."""\n\n'
        "from typing import TYPE_CHECKING\n\n"
        f"{constant} = tuple(f'{{__package__}}.{{name}}' for name in (\n{listed}))\n\n"
        "if TYPE_CHECKING:  # named here so that transformers copies them with the remote code\n"
        f"{imports}"
    )


def _plugins_module(flat: _Flattener, plugins: list[PluginModule], hashes: dict[str, str]) -> str:
    """The folder's ``attnlab.hf.export_plugins``: it imports each copied plugin module (and its
    helpers) only after checking its file against ``hashes`` (flat name -> SHA-256, also in
    config.json), from the bytes it checked."""
    body = []
    for p in plugins:
        classes = ", ".join(sorted({cls for _, _, cls in p.parts}))
        body.append(
            f"        with registering_as({p.spec!r}):\n"
            f"            from .{flat.flat(p.module)} import {classes}  # noqa: F401\n"
        )
    listed = "".join(f"    {name!r}: {digest!r},\n" for name, digest in sorted(hashes.items()))
    return (
        '"""The plugin parts this model uses, copied from its run by `attnlab export`.\n\n'
        "A copied plugin module (or a helper module it imports) is imported only after its file,\n"
        "beside this one, is found to hold the code the model was exported with: the SHA-256\n"
        "recorded here and in config.json's attnlab_plugins (flat_sha256). A changed, missing or\n"
        'linked-out file is refused; the bytes checked are the bytes imported."""\n\n'
        "import hashlib\n"
        "import importlib\n"
        "from pathlib import Path\n\n"
        f"from .{flat.flat(CHECKED_MODULE)} import CheckedSource, serving\n"
        "from .attnlab_parts_registry import registering_as\n\n"
        f"#: copied plugin module -> SHA-256 of its file as exported\nSHA256 = {{\n{listed}}}\n\n\n"
        f"{_CHECK_SOURCE}\n\n"
        "def load_export_plugins(config) -> None:\n"
        '    """Check the copied plugin modules, then import them from the bytes checked: their\n'
        '    @register decorators add their parts."""\n'
        "    checked = check_plugin_files(config)\n"
        "    sources = {\n"
        "        f'{__package__}.{name}': CheckedSource(f'{__package__}.{name}', str(path), data)\n"
        "        for name, (path, data) in checked.items()\n"
        "    }\n"
        "    with serving(sources):\n"
        f"{''.join(body)}"
        "        for name in sources:  # a helper imported later comes from its checked bytes too\n"
        "            importlib.import_module(name)\n"
    )


#: the check the folder's own export_plugins module runs before importing any plugin module
_CHECK_SOURCE = '''def _recorded(config) -> dict:
    """flat module -> SHA-256, as config.json's attnlab_plugins records them (helpers too)."""
    out = {}
    for p in getattr(config, "attnlab_plugins", None) or []:
        if isinstance(p, dict):
            for entry in [p, *(p.get("helpers") or [])]:
                if isinstance(entry, dict) and entry.get("flat_module"):
                    out[entry["flat_module"]] = entry.get("flat_sha256")
    return out


def check_plugin_files(config) -> dict:
    """The bytes of every copied plugin module, by flat name (with its path), once each is found
    in the folder (here, and in the model folder transformers copied it from, not a link out of
    it) and equal to the SHA-256 recorded here and in config.json; else ValueError naming the
    files."""
    here = Path(__file__).resolve().parent
    source = Path(str(getattr(config, "name_or_path", "") or ""))
    recorded = _recorded(config)
    bad, checked = [], {}
    for name, digest in SHA256.items():
        path = here / f"{name}.py"
        folders = (here, source.resolve()) if source.is_dir() else (here,)
        out = [r for r in ((f / path.name).resolve() for f in folders) if r.parent not in folders]
        if out:
            bad.append(f"{name}.py (a link to {out[0]}, outside the folder)")
            continue
        try:
            data = path.read_bytes()
        except OSError:
            bad.append(f"{name}.py (missing)")
            continue
        if hashlib.sha256(data).hexdigest() != digest or recorded.get(name) != digest:
            bad.append(f"{name}.py (not the code the model was exported with)")
        checked[name] = (path, data)
    if bad:
        raise ValueError(
            "this attnlab export will not import its plugin code: " + ", ".join(bad) + ". "
            "Export the run again, or restore the folder's files as exported"
        )
    return checked
'''


def flatten(plugins: list[PluginModule] = ()) -> Vendored:
    """Flatten the modeling code's import closure (and ``plugins``) into one folder's files."""
    own = [m for p in plugins for m in (p.module, *p.helpers)]
    roots = {"attnlab"} | {m.split(".")[0] for m in own}
    out = Vendored()
    flat = _Flattener(roots, out.names)
    todo = [*ROOTS, PLUGINS_MODULE, *own]
    seen: set[str] = set()
    while todo:
        module = todo.pop(0)
        if module in seen:
            continue
        seen.add(module)
        path, is_pkg = _source(module)
        if module in LISTED_PACKAGES:
            members = sorted(
                f"{module}.{p.stem}"
                for p in path.parent.glob("*.py")
                if p.name != "__init__.py" and not p.name.startswith("_")
            )
            out.files[f"{flat.flat(module)}.py"] = _listed_package(flat, module, members)
            todo.extend(members)
            continue
        if module == PLUGINS_MODULE:  # written once the plugin modules are (it hashes them)
            flat.flat(module)
            todo.extend(["attnlab.parts.registry", CHECKED_MODULE])
            continue
        text, deps = flat.rewrite(module, path, is_pkg)
        out.files[f"{flat.flat(module)}.py"] = _header(module, path) + text
        todo.extend(d for d in deps if d not in seen)
    plugin_files = {flat.flat(m) for m in out.names if m.split(".")[0] in roots - {"attnlab"}}
    out.plugin_sha256 = {
        name: hashlib.sha256(out.files[f"{name}.py"].encode()).hexdigest()
        for name in sorted(plugin_files)
        if f"{name}.py" in out.files
    }
    out.files[f"{flat.flat(PLUGINS_MODULE)}.py"] = _plugins_module(
        flat, list(plugins), out.plugin_sha256
    )
    for root in ROOTS:
        name = f"{flat.flat(root)}.py"
        out.files[name] += _name_every_module(sorted(set(out.files) - {name}))
    return out


def _name_every_module(files: list[str]) -> str:
    """A block that names every copied module as a direct relative import of a root module.

    transformers 4.x copies only the modules a local folder's root module imports itself (5.x
    follows the imports recursively), so each root names them all; the block never runs."""
    return (
        "\n\nif False:  # attnlab export: every copied module, imported as transformers 4.x looks for\n"
        "    # them (it copies only a local folder's direct `from .NAME import ...` modules)\n"
        + "".join(f"    from .{Path(f).stem} import *  # noqa: F403\n" for f in files)
    )


def check_tracked(folder: Path, vendored: Vendored) -> None:
    """Every copied module must be a direct relative import of each ``auto_map`` module: the
    imports transformers 4.x follows from a local folder (5.x follows them recursively too), or
    transformers would not copy it with the remote code."""
    from transformers.dynamic_module_utils import get_relative_imports

    for root in ("configuration_attnlab.py", "modeling_attnlab.py"):
        tracked = {root} | {f"{m}.py" for m in get_relative_imports(folder / root)}
        missing = sorted(set(vendored.files) - tracked)
        if missing:
            raise VendorError(
                f"transformers would not copy {', '.join(missing)} with the remote code of {root} "
                "(it does not import them); import them with `from .MODULE import NAME` there"
            )
