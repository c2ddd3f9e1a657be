"""The part registry: (slot, kind) -> part class, with where each came from.

Built-in parts register themselves the same way a plugin's do (``@register(slot, kind)``); the
built-in modules are every module of ``attnlab.model.parts``, imported on the first lookup. A name
registered twice is an error naming both sources (no silent overwrite), except the very same class
registered again (a module imported twice under one name).
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeVar

from attnlab.base import schema
from attnlab.base.schema import PartOptions
from attnlab.parts.part import Dims, Part
from attnlab.parts.registering import Builtins, taken_by_another, taken_message
from attnlab.parts.slots import NONE, SLOTS
from attnlab.parts.source import BUILTIN, PartError, current_source

P = TypeVar("P", bound=type[Part])


@dataclass(frozen=True)
class PartSpec:
    """One registered part: its class, its options class, and its source (``built-in`` or the
    plugin that registered it)."""

    slot: str
    kind: str
    cls: type[Part]
    source: str

    @property
    def options(self) -> type[PartOptions]:
        return self.cls.Options


_parts: dict[str, dict[str, PartSpec]] = {name: {} for name in SLOTS}


def _package() -> ModuleType:
    import attnlab.model.parts as pkg

    return pkg


_builtins = Builtins(_package, "PART_MODULES")
_lock = _builtins.lock


def register(slot: str, kind: str) -> Callable[[P], P]:
    """Class decorator: register a :class:`Part` subclass as ``kind`` in ``slot``.

    The class must derive from the slot's contract class (e.g. ``QueryPart`` for ``"query"``) and
    its ``Options`` from :class:`PartOptions`.
    """
    if slot not in SLOTS:
        near = difflib.get_close_matches(slot, list(SLOTS), n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise PartError(f"unknown slot {slot!r}{hint}; slots: {', '.join(SLOTS)}")
    if not isinstance(kind, str) or not kind.isidentifier() or kind == NONE:
        raise PartError(
            f"part kind {kind!r} in slot {slot!r} must be a Python-identifier-like name other "
            f"than {NONE!r}"
        )

    def deco(cls: P) -> P:
        base = SLOTS[slot].base
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise PartError(
                f"{getattr(cls, '__qualname__', cls)!r} registered as {slot}.{kind} must derive "
                f"from attnlab.parts.{base.__name__}"
            )
        if not (isinstance(cls.Options, type) and issubclass(cls.Options, PartOptions)):
            raise PartError(
                f"{cls.__qualname__}.Options must derive from attnlab.parts.PartOptions"
            )
        if not _builtins.loading:
            _builtins.load()  # built-in names are taken first: a plugin never pre-empts one
        source = current_source(cls)
        with _lock:
            old = _parts[slot].get(kind)
            if old is not None and taken_by_another(old.cls, old.source, cls, source):
                what = f"part {slot}.{kind}"
                raise PartError(
                    taken_message(what, old.cls, old.source, cls, source)
                    + ". Choose another kind name"
                )
            problems = cls.declaration_problems()
            if problems:  # a part the model would never use is refused, not dropped silently
                raise PartError(
                    f"{cls.__qualname__} registered as {slot}.{kind} would be unused: "
                    + "; ".join(problems)
                )
            cls.slot, cls.kind = slot, kind
            _parts[slot][kind] = PartSpec(slot, kind, cls, source)
        return cls

    return deco


def has(slot: str, kind: str) -> bool:
    _builtins.load()
    return (kind == NONE and SLOTS[slot].optional) or kind in _parts[slot]


def get(slot: str, kind: str) -> PartSpec:
    """The registered part ``kind`` of ``slot`` (the optional slots' ``none`` included)."""
    _builtins.load()
    if kind == NONE and SLOTS[slot].optional:
        return PartSpec(slot, NONE, _NoPart, BUILTIN)
    spec = _parts[slot].get(kind)
    if spec is None:
        raise PartError(unknown_kind_message(slot, kind))
    return spec


def kinds(slot: str) -> list[str]:
    """Registered kinds of ``slot`` in registration order (``none`` first for optional slots)."""
    _builtins.load()
    return ([NONE] if SLOTS[slot].optional else []) + list(_parts[slot])


def specs(slot: str | None = None) -> list[PartSpec]:
    """Every registered part (of one slot, or of all in slot order)."""
    _builtins.load()
    slots = [slot] if slot else list(SLOTS)
    return [spec for s in slots for spec in _parts[s].values()]


def default_kind(slot: str) -> str:
    return SLOTS[slot].default


def unknown_kind_message(slot: str, kind: Any) -> str:
    names = kinds(slot)
    near = difflib.get_close_matches(str(kind), names, n=1, cutoff=0.5)
    hint = f"did you mean {near[0]!r}? " if near else ""
    return (
        f"{kind!r} is not a registered {slot} part; {hint}choose one of "
        f"{', '.join(map(repr, names))}. A part of your own is loaded with --plugin FILE.py or "
        "plugins = [...] in the config file (`attnlab parts` lists what is registered)"
    )


def build(opts: PartOptions, dims: Dims, slot: str | None = None) -> Part | None:
    """The part ``opts`` describes, built for ``dims`` (None for an empty optional slot)."""
    slot = slot or _slot_of(opts)
    spec = get(slot, opts.kind)
    if spec.cls is _NoPart:
        return None
    return spec.cls(opts, dims)


def _slot_of(opts: PartOptions) -> str:
    for slot, table in _parts.items():
        for spec in table.values():
            if isinstance(opts, spec.options) and spec.kind == opts.kind:
                return slot
    raise PartError(f"options {type(opts).__name__}(kind={opts.kind!r}) belong to no slot")


class _NoPart(Part):
    """The empty choice of an optional slot (``kind = "none"``)."""

    Options = PartOptions


schema.use_part_lookup(sys.modules[__name__])  # slot fields of the config validate against this
