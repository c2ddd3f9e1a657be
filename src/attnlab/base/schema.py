"""The building blocks of every typed config: the strict ``Section`` base (from
:mod:`attnlab.base.section`, re-exported here), and the ``PartOptions`` field that takes its schema from
the part registry.

A slot field (``model.query``, ``model.score``, ...) holds the options of whichever part kind the
table names: ``{kind = "nonlinear", ratio = 0.5}`` is validated by the nonlinear query's own options
class, found in the registry at validation time. So a plugin's parts are validated exactly like the
built-in ones, with the same messages, and nothing here has to know them in advance. This module
needs only pydantic; the part registry installs itself here (:func:`use_part_lookup`) when it is
imported, so this module never imports it.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Protocol, get_args

from pydantic import Field, SerializeAsAny, WrapValidator
from pydantic_core import PydanticCustomError

from attnlab.base.section import Section

__all__ = [
    "DEFAULT_INIT_STD",
    "Activation",
    "PartOptions",
    "Section",
    "default_options",
    "slot_field",
]

Activation = Literal["gelu", "relu", "relu2", "silu"]

#: the std of the normal init of a weight when nothing sets another (GPT-2's, nanoGPT's): the
#: default of ``model.init_std``, of a part's ``Init``, and of the probe's injected parts
DEFAULT_INIT_STD = 0.02


class PartOptions(Section):
    """Base of a part's options. ``kind`` names the part in its slot; the registry fills it in.

    A part's options subclass this and add typed fields with defaults and bounds. ``check``
    returns the impossible combinations this part's options make with the rest of a model
    config (each as one sentence naming the keys and the fix); it runs when the config loads.
    """

    kind: str = ""
    #: the slot this options class is read in (set by the registry for the error messages)
    slot: ClassVar[str] = ""

    def check(self, model: Any) -> list[str]:
        """Problems with ``model`` (the whole :class:`~attnlab.config.ModelConfig`)."""
        return []


class PartLookup(Protocol):
    """What validation asks of the part registry (:mod:`attnlab.parts.registry` is one)."""

    def get(self, slot: str, kind: str) -> Any: ...  # a spec with ``.options``
    def has(self, slot: str, kind: str) -> bool: ...
    def default_kind(self, slot: str) -> str: ...
    def unknown_kind_message(self, slot: str, kind: Any) -> str: ...


_lookup: PartLookup | None = None


def use_part_lookup(lookup: PartLookup) -> None:
    """Install the registry that slot fields validate against (the part registry calls this
    when it is imported, so this module never imports it: config and parts stay one-way)."""
    global _lookup
    _lookup = lookup


def part_lookup() -> PartLookup:
    """The installed registry; ``import attnlab.parts`` installs it (``config.ModelConfig``
    imports it before validating a slot)."""
    if _lookup is None:
        raise RuntimeError("no part registry is installed: import attnlab.parts first")
    return _lookup


def _dispatch(slot: str):
    def validate(value: Any, handler: Any) -> PartOptions:
        registry = part_lookup()
        if isinstance(value, PartOptions):
            registry.get(slot, value.kind)  # a kind registered in this process
            return value
        if not isinstance(value, dict):
            raise PydanticCustomError(
                "part_table",
                "must be a table such as {{kind = '{default}'}}, got {got!r}",
                {"default": registry.default_kind(slot), "got": value},
            )
        kind = value.get("kind", registry.default_kind(slot))
        if not isinstance(kind, str) or not registry.has(slot, kind):
            raise PydanticCustomError(
                "unknown_part",
                "{problem}",
                {"problem": registry.unknown_kind_message(slot, kind), "kinds": ""},
            )
        cls = registry.get(slot, kind).options
        return cls.model_validate({**value, "kind": kind})

    return validate


class SlotMarker:
    """Field metadata naming the slot a :func:`slot_field` reads (for error messages)."""

    def __init__(self, slot: str) -> None:
        self.slot = slot


def slot_field(slot: str) -> Any:
    """The annotation of a config field that holds the options of one part in ``slot``."""
    return Annotated[SerializeAsAny[PartOptions], WrapValidator(_dispatch(slot)), SlotMarker(slot)]


def slot_of(field: Any) -> str | None:
    """The slot a pydantic ``FieldInfo`` reads (also an optional one, ``slot_field(s) | None``),
    or None for an ordinary field."""
    inner = [getattr(a, "__metadata__", ()) for a in get_args(getattr(field, "annotation", None))]
    for m in [*getattr(field, "metadata", ()), *(m for ms in inner for m in ms)]:
        if isinstance(m, SlotMarker):
            return m.slot
    return None


def default_options(slot: str) -> Any:
    """A ``Field`` whose default is the slot's default part with its default options."""

    def make() -> PartOptions:
        registry = part_lookup()
        return registry.get(slot, registry.default_kind(slot)).options(
            kind=registry.default_kind(slot)
        )

    return Field(default_factory=make)
