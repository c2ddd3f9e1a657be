"""The parts of an exported model's plugins, when the folder is loaded with attnlab installed.

An exported folder holds each plugin twice: flattened for the remote code (``attnlab_plugin_*.py``,
imported by the folder's own generated version of this module) and as the original file under
``plugins/`` (what this module loads into attnlab's registry). ``config.attnlab_plugins`` lists,
per plugin, the file, its SHA-256 (:func:`attnlab.parts.plugins.source_hash`) and the parts it
provides. A part already registered from a file with that hash is used as it is; a part registered
from different code is refused, since the weights were trained with the exported code.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from attnlab.base.errors import UserError
from attnlab.parts import load_plugin, registry
from attnlab.parts.plugins import source_hash


def _registered_hash(slot: str, kind: str) -> str | bool | None:
    """The source hash of the module registering ``slot.kind`` (False if not registered)."""
    if not registry.has(slot, kind):
        return False
    module = sys.modules.get(registry.get(slot, kind).cls.__module__)
    path = getattr(module, "__file__", None)
    if not path:
        return None
    p = Path(path)
    files = sorted(p.parent.rglob("*.py")) if p.name == "__init__.py" else [p]
    return source_hash(files)


def _file_in_folder(config: Any, relative: str) -> Path:
    root = Path(str(getattr(config, "name_or_path", "") or ""))
    if (root / relative).is_file():
        return root / relative
    try:
        from transformers.utils import cached_file

        found = cached_file(str(root), relative)
    except OSError:
        found = None
    if found is None:
        raise UserError(
            f"the plugin file {relative} of the exported model {str(root)!r} was not found; load "
            "the complete folder, or pass trust_remote_code=True to use its flattened copy"
        )
    return Path(found)


def load_export_plugins(config: Any) -> None:
    """Register the parts of every plugin ``config.attnlab_plugins`` names (see module doc)."""
    for plugin in getattr(config, "attnlab_plugins", None) or []:
        parts = [(slot, kind) for slot, kind, _ in plugin["parts"]]
        hashes = {registry_hash for registry_hash in (_registered_hash(*p) for p in parts)}
        if hashes == {plugin["sha256"]}:
            continue
        if hashes != {False}:
            taken = [f"{s}.{k}" for s, k in parts if _registered_hash(s, k) is not False]
            raise UserError(
                f"part(s) {', '.join(taken)} of the exported model are already registered from "
                f"other code than the plugin it was trained with ({plugin['spec']}); load it in a "
                "fresh process, or with trust_remote_code=True to use the folder's copy"
            )
        load_plugin(str(_file_in_folder(config, plugin["file"])))
