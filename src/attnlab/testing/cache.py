"""Results of checking a plugin's parts, kept on disk so that ``train``, ``compare``, ``probe``
and ``bench`` pay for the check once per plugin source.

A result is keyed by the SHA-256 of the part's plugin (the plugin record's identity: its files and
the local helper modules it imports, so a changed helper is checked again; else the defining
file's), attnlab's version, the slot, kind and options, which properties ran, and the battery's
list of properties. Files
live in ``$XDG_CACHE_HOME/attnlab/checks/`` (default ``~/.cache/attnlab/checks/``);
``ATTNLAB_CHECK_CACHE`` names another directory."""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import sys
from pathlib import Path
from typing import Any

import attnlab
from attnlab.parts import registry
from attnlab.parts.plugins import loaded, record_of, source_hash
from attnlab.testing.result import PROPERTIES, PartReport

ENV = "ATTNLAB_CHECK_CACHE"


def cache_dir() -> Path:
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "attnlab" / "checks"


def source_sha256(cls: type) -> str | None:
    """The SHA-256 of the plugin that defines ``cls``: the identity its plugin record holds (its
    files and the local helper modules it imports, :mod:`attnlab.parts.identity`), found by the
    source the part registered under, else by module; a class of no recorded plugin: its file."""
    for spec in registry.specs():
        if spec.cls is cls:
            rec = record_of(spec.source)
            if rec is not None and rec.sha256:
                return rec.sha256
    module = cls.__module__
    for rec in loaded():
        if rec.sha256 and (rec.module == module or module.startswith(f"{rec.module}.")):
            return rec.sha256
    try:
        path = inspect.getsourcefile(sys.modules[module])
    except (KeyError, TypeError):
        return None
    return source_hash([Path(path)]) if path else None


def key(cls: type, slot: str, kind: str, options: dict[str, Any], what: str) -> str | None:
    sha = source_sha256(cls)
    if sha is None:
        return None
    blob = json.dumps(
        {
            "sha256": sha,
            "attnlab": attnlab.__version__,
            "slot": slot,
            "kind": kind,
            "options": options,
            "what": what,
            "properties": PROPERTIES,  # a battery that grew checks its cached parts again
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def read(k: str | None) -> PartReport | None:
    if k is None:
        return None
    try:
        return PartReport.from_dict(json.loads((cache_dir() / f"{k}.json").read_text("utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent or damaged: check again


def write(k: str | None, report: PartReport) -> Path | None:
    """Store a report (only passing ones: a failure is checked again after the fix)."""
    if k is None or not report.passed:
        return None
    from attnlab.base.atomic import atomic_write_json

    path = cache_dir() / f"{k}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, report.to_dict())
    except OSError:
        return None  # an unwritable cache costs a re-check, nothing else
    return path
