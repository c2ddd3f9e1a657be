"""What the part registry and the family registry share: their built-in members imported once on
first use, and the refusal of a second registration of a taken name.

A registry's built-ins are every module of its package (``attnlab.model.parts``,
``attnlab.model.families``) or, in the flat copy an export carries (:mod:`attnlab.hf.vendor`),
the modules the package lists in ``PART_MODULES`` / ``FAMILY_MODULES``. Loading them is guarded
by a lock and a "loading" flag, so a built-in module that registers while they load does not
start the load again; installed plugins (entry points) load right after, except in a flat copy,
which holds exactly its own code.
"""

from __future__ import annotations

import importlib
import pkgutil
import threading
from collections.abc import Callable
from types import ModuleType

from attnlab.parts.source import BUILTIN, registering_as


class Builtins:
    """The built-in members of one registry: the modules of the package ``package()`` returns,
    or the names it lists in ``listed``. ``package`` imports it by a plain ``import`` statement
    (so that an export's flat copy rewrites that import like every other)."""

    def __init__(self, package: Callable[[], ModuleType], listed: str) -> None:
        self.package, self.listed = package, listed
        self.lock = threading.RLock()
        self.loaded = False
        self.loading = False

    def modules(self) -> tuple[list[str], bool]:
        """(dotted names of the built-in modules, whether this is a flattened copy)."""
        pkg = self.package()
        listed = getattr(pkg, self.listed, None)
        if listed is not None:
            return list(listed), True
        infos = sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name)
        return [f"{pkg.__name__}.{info.name}" for info in infos], False

    def load(self) -> None:
        """Import the built-in modules once (they register as built-in), then the plugins that
        installed packages declare (entry points), except in a flattened copy."""
        if self.loaded or self.loading:
            return
        with self.lock:
            if self.loaded:
                return
            modules, flattened = self.modules()
            self.loading = True
            try:
                with registering_as(BUILTIN):
                    for name in modules:
                        importlib.import_module(name)
            finally:
                self.loading = False
            self.loaded = True
        if flattened:  # an exported model holds exactly its own code: no installed plugins
            return
        from attnlab.parts.plugins import load_entry_points

        load_entry_points()


def taken_by_another(old_cls: type, old_source: str, cls: type, source: str) -> bool:
    """Whether registering ``cls`` from ``source`` under a name ``old_cls`` holds (registered
    from ``old_source``) would replace another class: the same class, or the same module and
    name from the same source (a module imported again), is not another."""
    if old_cls is cls:
        return False
    same = (old_cls.__module__, old_cls.__qualname__) == (cls.__module__, cls.__qualname__)
    return not (same and old_source == source)


def taken_message(what: str, old_cls: type, old_source: str, cls: type, source: str) -> str:
    """The refusal of a taken name: who holds it and who tried, without the fix."""
    return (
        f"{what} is already registered by {old_source} ({old_cls.__module__}."
        f"{old_cls.__qualname__}); {source} tried to register it again as {cls.__module__}."
        f"{cls.__qualname__}"
    )
