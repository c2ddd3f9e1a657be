"""The parts of an exported model's plugins, when the folder is loaded with attnlab installed.

An exported folder holds each plugin twice: flattened for the remote code (``attnlab_plugin_*.py``,
imported by the folder's own generated version of this module, :mod:`attnlab.hf.vendor`) and as
the original file under ``plugins/`` (what this module loads into attnlab's registry).
``config.attnlab_plugins`` lists, per plugin, the file, its SHA-256
(:func:`attnlab.parts.plugins.source_hash`) and the parts it provides.

**No code runs from a folder without consent.** A part already registered from a file with the
recorded hash is used as it is (nothing is imported: ``--init-from`` with ``--plugin``); a part
registered from different code is refused, since the weights were trained with the exported
code. Otherwise the folder's file would be imported, and before anything is imported:

1. its path must be ``plugins/NAME.py`` and resolve (links followed) inside the folder;
2. its SHA-256 must equal the one ``config.json`` records;
3. the user must have consented (:mod:`attnlab.base.consent`: ``--trust-remote-code``, or
   ``trust_remote_code=True`` in ``from_pretrained``).

Each refusal names the files (and, without consent, the flag). Cost: one read and hash per file.
"""

from __future__ import annotations

import sys
from pathlib import Path, PurePosixPath
from typing import Any

from attnlab.base.consent import RemoteCodeError, how_to_consent, remote_code_trusted
from attnlab.parts import families, load_plugin, registry
from attnlab.parts.plugins import source_hash


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
    return source_hash(files)


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
        for p in raw
    )
    if not ok:
        raise RemoteCodeError(
            f"config.json of {str(_root(config))!r} has a damaged attnlab_plugins list (each "
            "entry needs spec, file, sha256 and parts [slot, kind, class]); export the run again"
        )
    return raw


def folder_file(root: Path, relative: Any) -> Path:
    """The plugin file ``relative`` (``plugins/NAME.py``) of the folder ``root``: refused when it
    names anything else or resolves, through a link, outside the folder."""
    pure = PurePosixPath(relative) if isinstance(relative, str) else None
    if (
        pure is None
        or "\\" in relative
        or "\0" in relative
        or pure.is_absolute()
        or len(pure.parts) != 2
        or pure.parts[0] != "plugins"
        or pure.suffix != ".py"
        or ".." in pure.parts
    ):
        raise RemoteCodeError(
            f"config.json of {str(root)!r} names the plugin file {relative!r}, which is not a "
            "file plugins/NAME.py inside the folder; attnlab reads nothing outside a model "
            "folder. Export the run again"
        )
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


def _needed(config: Any) -> list[tuple[dict[str, Any], Path]]:
    """(entry, file) of every plugin whose parts are not registered yet, each file checked
    (path, hash) without importing anything."""
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
        if source_hash([path]) != plugin.get("sha256"):
            changed.append(str(plugin["file"]))
        todo.append((plugin, path))
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
        files = ", ".join(f"{p['file']} (sha256 {str(p['sha256'])[:16]})" for p, _ in todo)
        raise RemoteCodeError(
            f"the model folder {str(_root(config))!r} holds code that building it would run: "
            f"{files}. attnlab runs a folder's code only with your consent: read the file(s), "
            f"then {how_to_consent()}"
        )
    for _, path in todo:
        load_plugin(str(path))


__all__ = ["RemoteCodeError", "folder_file", "load_export_plugins"]
