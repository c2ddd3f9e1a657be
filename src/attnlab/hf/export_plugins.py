"""The parts of an exported model's plugins, when the folder is loaded with attnlab installed.

An exported folder holds each plugin twice: flattened for the remote code (``attnlab_plugin_*.py``,
imported by the folder's own generated version of this module, :mod:`attnlab.hf.vendor`) and as
the original file under ``plugins/`` (what this module loads into attnlab's registry).
``config.attnlab_plugins`` lists, per plugin, the file, its SHA-256
(:func:`attnlab.parts.plugins.source_hash`), the parts it provides and its helpers: the local
modules it imports (:mod:`attnlab.parts.identity`), copied to ``plugins/helpers/`` by module path
(``a.b`` -> ``plugins/helpers/a/b.py``) with their SHA-256, so the folder loads where the plugin's
own directory is gone.

**No code runs from a folder without consent.** A part already registered from a file with the
recorded hash is used as it is (nothing is imported: ``--init-from`` with ``--plugin``); a part
registered from different code is refused, since the weights were trained with the exported
code. Otherwise the folder's file would be imported, and before anything is imported:

1. its path must be ``plugins/NAME.py`` (a helper's: ``plugins/helpers/`` + its module path)
   and resolve (links followed) inside the folder;
2. its SHA-256 must equal the one ``config.json`` records, and so must each helper's;
3. the user must have consented (:mod:`attnlab.base.consent`: ``--trust-remote-code``, or
   ``trust_remote_code=True`` in ``from_pretrained``).

Each file is read once: its bytes are hashed and, when they pass, imported as they are
(:mod:`attnlab.parts.checked`; the helpers served under their module names while the plugin is
imported), so a file swapped between the check and the import never runs.
Each refusal names the files (and, without consent, the flag). Cost: one read and hash per file.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path, PurePosixPath
from typing import Any

from attnlab.base.consent import RemoteCodeError, how_to_consent, remote_code_trusted
from attnlab.parts import families, load_plugin, registry
from attnlab.parts.checked import CheckedSource, serving
from attnlab.parts.identity import module_file
from attnlab.parts.plugins import source_hash

#: where an export keeps its plugins' helper modules
HELPERS = "plugins/helpers"


def _registered_hash(slot: str, kind: str) -> str | bool | None:
    """The source hash of the module registering ``slot.kind`` (a family: ``family.NAME``;
    False if not registered)."""
    if slot == families.SLOT:
        if not families.has(kind):
            return False
        cls: type = families.spec(kind).cls
    elif not registry.has(slot, kind):
        return False
    else:
        cls = registry.get(slot, kind).cls
    module = sys.modules.get(cls.__module__)
    path = getattr(module, "__file__", None)
    if not path:
        return None
    p = Path(path)
    files = sorted(p.parent.rglob("*.py")) if p.name == "__init__.py" else [p]
    try:
        return source_hash(files)
    except OSError:  # its file is gone since: nothing to compare, so not the same code
        return None


def _root(config: Any) -> Path:
    return Path(str(getattr(config, "name_or_path", "") or ""))


def _entries(config: Any) -> list[dict[str, Any]]:
    """``config.attnlab_plugins``, each entry checked for the shape an export writes."""
    raw = getattr(config, "attnlab_plugins", None) or []
    ok = isinstance(raw, list) and all(
        isinstance(p, dict)
        and isinstance(p.get("spec"), str)
        and isinstance(p.get("parts"), list)
        and all(
            isinstance(t, list | tuple) and len(t) == 3 and all(isinstance(s, str) for s in t)
            for t in p["parts"]
        )
        and isinstance(p.get("helpers", []), list)
        and all(
            isinstance(h, dict) and all(isinstance(h.get(k), str) for k in ("module", "sha256"))
            for h in p.get("helpers", [])
        )
        for p in raw
    )
    if not ok:
        raise RemoteCodeError(
            f"config.json of {str(_root(config))!r} has a damaged attnlab_plugins list (each "
            "entry needs spec, file, sha256, parts [slot, kind, class] and helpers [module, file, "
            "sha256]); export the run again"
        )
    return raw


def helper_file(module: str, package: bool = False) -> str:
    """Where an export keeps the helper module ``module``: ``plugins/helpers/a/b.py`` for
    ``a.b`` (``.../a/b/__init__.py`` for a package)."""
    return f"{HELPERS}/{module.replace('.', '/')}" + ("/__init__.py" if package else ".py")


def _shape_ok(relative: str, module: str | None) -> bool:
    """``relative`` is ``plugins/NAME.py`` (a plugin), or the :func:`helper_file` of
    ``module`` (a helper, whose name must be a dotted Python name)."""
    pure = PurePosixPath(relative)
    if "\\" in relative or "\0" in relative or pure.is_absolute() or ".." in pure.parts:
        return False
    if module is None:
        return len(pure.parts) == 2 and pure.parts[0] == "plugins" and pure.suffix == ".py"
    names = module.split(".")
    return all(n.isidentifier() for n in names) and relative in (
        helper_file(module),
        helper_file(module, package=True),
    )


def folder_file(root: Path, relative: Any, module: str | None = None) -> Path:
    """The plugin file ``relative`` (``plugins/NAME.py``; for the helper ``module`` its
    :func:`helper_file`) of the folder ``root``: refused when it names anything else or
    resolves, through a link, outside the folder."""
    if not isinstance(relative, str) or not _shape_ok(relative, module):
        where = f"the file of its helper {module}" if module else "a file plugins/NAME.py"
        raise RemoteCodeError(
            f"config.json of {str(root)!r} names the plugin file {relative!r}, which is not "
            f"{where} inside the folder; attnlab reads nothing outside a model folder. Export "
            "the run again"
        )
    pure = PurePosixPath(relative)
    if root.is_dir():
        path = root / pure
        real, inside = path.resolve(), root.resolve()
        if not real.is_relative_to(inside):
            raise RemoteCodeError(
                f"the plugin file {relative} of {str(root)!r} is a link to {real}, outside the "
                "folder; attnlab imports nothing from outside a model folder. Replace the link "
                "by the file itself"
            )
        if real.is_file():
            return path
    try:
        from transformers.utils import cached_file

        found = cached_file(str(root), relative)
    except OSError:
        found = None
    if found is None:
        raise RemoteCodeError(
            f"the plugin file {relative} of the exported model {str(root)!r} was not found; load "
            "the complete folder"
        )
    return Path(found)


def _helpers(root: Path, plugin: dict[str, Any], changed: list[str]) -> list[CheckedSource]:
    """The checked sources of the plugin's helpers (each file's bytes; a mismatch goes to
    ``changed``). A helper already imported from other code is refused: the parts would not
    compute what was exported."""
    out = []
    for h in plugin.get("helpers") or []:
        path = folder_file(root, h.get("file"), h["module"])
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != h["sha256"]:
            changed.append(str(h.get("file")))
        loaded = module_file(sys.modules.get(h["module"]))
        if loaded is not None and hashlib.sha256(loaded.read_bytes()).hexdigest() != h["sha256"]:
            raise RemoteCodeError(
                f"the module {h['module']} is already imported from {loaded}, not the helper "
                f"{h.get('file')} of {str(root)!r} the model was exported with; load it in a "
                "fresh process"
            )
        out.append(CheckedSource(h["module"], str(path), data, path.name == "__init__.py"))
    return out


def _needed(config: Any) -> list[tuple[dict[str, Any], CheckedSource, list[CheckedSource]]]:
    """(entry, its file's checked source, its helpers') of every plugin whose parts are not
    registered yet, each file checked (path, hash) without importing anything."""
    todo, changed = [], []
    for plugin in _entries(config):
        parts = [(slot, kind) for slot, kind, _ in plugin["parts"]]
        hashes = {_registered_hash(*p) for p in parts}
        if hashes == {plugin.get("sha256")}:
            continue
        if hashes != {False}:
            taken = [f"{s}.{k}" for s, k in parts if _registered_hash(s, k) is not False]
            raise RemoteCodeError(
                f"part(s) {', '.join(taken)} of the exported model are already registered from "
                f"other code than the plugin it was trained with ({plugin['spec']}); load it in a "
                "fresh process"
            )
        if not plugin.get("file"):
            raise RemoteCodeError(
                f"the exported model's parts {', '.join(f'{s}.{k}' for s, k in parts)} come from "
                f"the package {plugin['spec']}, which the folder does not hold; install it and "
                f"load it first (--plugin {plugin['spec']})"
            )
        path = folder_file(_root(config), plugin["file"])
        data = path.read_bytes()  # read once: these bytes are hashed, then imported
        if source_hash([path], {path.resolve(): data}) != plugin.get("sha256"):
            changed.append(str(plugin["file"]))
        helpers = _helpers(_root(config), plugin, changed)
        todo.append((plugin, CheckedSource(str(path), str(path), data), helpers))
    if changed:
        raise RemoteCodeError(
            f"the plugin file(s) {', '.join(changed)} of {str(_root(config))!r} differ from the "
            "code the model was exported with (their SHA-256 is not the one config.json "
            "records); attnlab will not import them. Export the run again, or restore the files"
        )
    return todo


def load_export_plugins(config: Any) -> None:
    """Register the parts of every plugin ``config.attnlab_plugins`` names (see module doc)."""
    todo = _needed(config)
    if not todo:
        return
    if not remote_code_trusted():
        files = ", ".join(
            f"{f} (sha256 {str(d)[:16]})"
            for p, _, _ in todo
            for f, d in [(p["file"], p["sha256"])]
            + [(h["file"], h["sha256"]) for h in p.get("helpers") or []]
        )
        raise RemoteCodeError(
            f"the model folder {str(_root(config))!r} holds code that building it would run: "
            f"{files}. attnlab runs a folder's code only with your consent: read the file(s), "
            f"then {how_to_consent()}"
        )
    for _, own, helpers in todo:
        files = {Path(f.path).resolve(): f.data for f in [own, *helpers]}
        with serving({h.name: h for h in helpers}):  # one imported later comes from these too
            load_plugin(own.path, checked=files, also=[h.name for h in helpers])


__all__ = ["HELPERS", "RemoteCodeError", "folder_file", "helper_file", "load_export_plugins"]
