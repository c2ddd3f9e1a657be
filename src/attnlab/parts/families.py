"""The family registry: name -> the registered :class:`~attnlab.parts.family.Family`, with where
it came from.

Built-in families register themselves the way a plugin's do (``@register_family("decoder")``);
the built-in modules are every module of ``attnlab.model.families``, imported on the first
lookup. Plugins come through the part loader (:mod:`attnlab.parts.plugins`: ``--plugin``,
``plugins = [...]``, the ``attnlab.parts`` entry points), with the same source records and
hashes. A name registered twice is an error naming both sources, except the very same class
registered again (a module imported twice under one name).
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from attnlab.parts.family import Family, Objective
from attnlab.parts.source import BUILTIN, PartError, current_source, registering_as

F = TypeVar("F", bound=type[Family])

#: the family of a config that names none
DEFAULT = "decoder"
#: what an export's record of a plugin calls the family it provides (beside its parts' slots)
SLOT = "family"


class FamilyError(PartError):
    """A family that cannot be registered or found; the message names it and the fix."""


@dataclass(frozen=True)
class FamilySpec:
    """One registered family: its name, its (only) instance and its source."""

    name: str
    family: Family
    source: str

    @property
    def cls(self) -> type[Family]:
        return type(self.family)


_families: dict[str, FamilySpec] = {}
_lock = threading.RLock()
_builtins_loaded = False
_builtins_loading = False


def register(name: str) -> Callable[[F], F]:
    """Class decorator: register a :class:`Family` subclass as ``model.family = name``."""
    if not isinstance(name, str) or not name.isidentifier():
        raise FamilyError(f"family name {name!r} must be a Python-identifier-like name")

    def deco(cls: F) -> F:
        if not (isinstance(cls, type) and issubclass(cls, Family)):
            raise FamilyError(
                f"{getattr(cls, '__qualname__', cls)!r} registered as family {name!r} must "
                "derive from attnlab.parts.Family"
            )
        if not _builtins_loading:
            _load_builtins()  # built-in names are taken first: a plugin never pre-empts one
        # a built-in module first imported by a plugin (to derive from it) is still built-in
        source = BUILTIN if cls.__module__ in _builtin_modules()[0] else current_source(cls)
        with _lock:
            old = _families.get(name)
            if old is not None and old.cls is not cls:
                same = (old.cls.__module__, old.cls.__qualname__) == (
                    cls.__module__,
                    cls.__qualname__,
                ) and old.source == source
                if not same:
                    raise FamilyError(
                        f"family {name!r} is already registered by {old.source} "
                        f"({old.cls.__module__}.{old.cls.__qualname__}); {source} tried to "
                        f"register it again as {cls.__module__}.{cls.__qualname__}. Choose "
                        "another family name"
                    )
            problems = cls.declaration_problems()
            if problems:
                raise FamilyError(
                    f"{cls.__qualname__} registered as family {name!r} cannot be used: "
                    + "; ".join(problems)
                )
            cls.name = name
            _families[name] = FamilySpec(name, cls(), source)
        return cls

    return deco


def _builtin_modules() -> tuple[list[str], bool]:
    """(dotted names of the built-in family modules, whether this is a flattened copy): every
    module of ``attnlab.model.families``, or the ``FAMILY_MODULES`` a flattened copy of that
    package lists (an export's remote code, :mod:`attnlab.hf.vendor`)."""
    import attnlab.model.families as pkg

    listed = getattr(pkg, "FAMILY_MODULES", None)
    if listed is not None:
        return list(listed), True
    infos = sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name)
    return [f"{pkg.__name__}.{info.name}" for info in infos], False


def _load_builtins() -> None:
    global _builtins_loaded, _builtins_loading
    if _builtins_loaded or _builtins_loading:
        return
    with _lock:
        if _builtins_loaded:
            return
        modules, flattened = _builtin_modules()
        _builtins_loading = True
        try:
            with registering_as(BUILTIN):
                for name in modules:
                    importlib.import_module(name)
        finally:
            _builtins_loading = False
        _builtins_loaded = True
    if flattened:  # an exported model holds exactly its own code: no installed plugins
        return
    from attnlab.parts.plugins import load_entry_points

    load_entry_points()


def has(name: Any) -> bool:
    _load_builtins()
    return isinstance(name, str) and name in _families


def get(name: str) -> Family:
    """The registered family ``name``."""
    return spec(name).family


def spec(name: str) -> FamilySpec:
    _load_builtins()
    found = _families.get(name) if isinstance(name, str) else None
    if found is None:
        raise FamilyError(unknown_message(name))
    return found


def of(cfg: Any) -> Family:
    """The family of a ``ModelConfig`` (or anything with a ``family`` name)."""
    return get(getattr(cfg, "family", DEFAULT))


def names() -> list[str]:
    """Registered family names: the built-ins in module order, then the others as registered."""
    return [s.name for s in specs()]


def specs() -> list[FamilySpec]:
    """Every registered family, in the order of :func:`names` (a plugin that imports a built-in
    family module to derive from it may have it registered after the others)."""
    _load_builtins()
    order = {name: i for i, name in enumerate(_builtin_modules()[0])}
    found = list(_families.values())
    return sorted(found, key=lambda s: order.get(s.cls.__module__, len(order)))


def objective(name: str) -> Objective:
    """The objective called ``name`` among the registered families' own."""
    found = {s.family.objective.name: s.family.objective for s in specs()}
    if name not in found:
        raise FamilyError(
            f"no registered family trains with objective {name!r}; objectives: "
            f"{', '.join(map(repr, found))}"
        )
    return found[name]


def where(test: Callable[[Family], bool]) -> str:
    """``model.family='a'`` (or ``'a' or 'b'``, or ``no registered family``): the families
    for which ``test`` holds, for messages."""
    found = [s.name for s in specs() if test(s.family)]
    if not found:
        return "no registered family"
    return "model.family=" + " or ".join(map(repr, found))


def unknown_message(name: Any) -> str:
    known = names()
    near = difflib.get_close_matches(str(name), known, n=1, cutoff=0.5)
    hint = f"did you mean {near[0]!r}? " if near else ""
    return (
        f"{name!r} is not a registered model family; {hint}choose one of "
        f"{', '.join(map(repr, known))}. A family of your own is loaded with --plugin FILE.py "
        "or plugins = [...] in the config file (`attnlab parts family` lists what is registered)"
    )
