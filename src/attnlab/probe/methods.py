"""Probe methods by name: a set of components, parsed from strings such as ``preproj+skip``.

Grammar: ``COMPONENT("+"COMPONENT)*["@"TARGET]`` or ``frozen``. A component is ``lora`` (PEFT
LoRA on the attention projections) or any registered part that can be injected into a pretrained
model, as its slot and the part declare (``Slot.probe``, ``Part.probe_ready``): every
``feature_map`` part (a forward pre-hook replaces the attention input x^ by x~), every
``side_branch`` part (a forward hook adds S(x~) to the attention output), and every ``query``
part that declares ``pretrained_delta`` (a hook adds it to the base's q). Built-in:

==================  ==================================================================  ============
component           what is injected into every attention block                         params/layer
==================  ==================================================================  ============
``preproj``         x~ = x^ + W_down act(W_up x^), Q/K/V read x~ [pre_projection]       2 e d^2
``skip``            out = x + attn + W_skip x~ [content_skip]                           d^2
``anchored-query``  q = u W_Q + f(u), f(u) = LN(act(RMSNorm(u) W1) W2) [anchored]       2 d r + O(d)
``lora``            PEFT LoRA on the attention projections (q/k/v/o by default)         r (in + out)
==================  ==================================================================  ============

A plugin's parts join under their kind name (or their class's ``probe_name``); ``attnlab parts``
marks which ones can be probed. At most one component per slot.

``@TARGET`` (only with ``lora``) solves the LoRA rank so the method's *actual* trainable count
(counted after ``get_peft_model``) matches the method ``TARGET``'s count on the same base:
``lora@preproj+skip`` is LoRA as large as pre-projection + content skip, ``preproj+lora@preproj+skip``
spends the rest of that budget on LoRA. ``frozen`` trains nothing (the base evaluated as is).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from attnlab.parts import registry
from attnlab.parts.slots import probe_slots

LORA = "lora"
FROZEN = "frozen"
#: what a probe config trains when it names no method (seed 000's pre-projection + skip)
DEFAULT_METHOD = "preproj+skip"
_FROZEN_ALIASES = ("frozen", "baseline", "none")


class MethodError(ValueError):
    """A method string that cannot be parsed; the message names the part and the fix."""


@dataclass(frozen=True)
class Component:
    """One injectable part: its method name, slot and registered kind."""

    name: str
    slot: str
    kind: str


def components() -> list[Component]:
    """Every injectable registered part, in the slots' probe order (``Slot.probe``), then in
    registration order."""
    return [
        Component(spec.cls.probe_name or spec.kind, slot.name, spec.kind)
        for slot in probe_slots()
        for spec in registry.specs(slot.name)
        if slot.can_probe(spec.cls)
    ]


def component_names() -> list[str]:
    return [c.name for c in components()] + [LORA]


def _norm(s: str) -> str:
    return s.strip().lower().replace("-", "_")


def find_component(token: str) -> Component | None:
    """The component a name or alias refers to (its method name, its kind, either with '-' or
    '_' or no separator), or None."""
    key = _norm(token)
    for c in components():
        for alias in (c.name, c.kind, f"{c.kind}_{c.slot}"):
            a = _norm(alias)
            if key in (a, a.replace("_", "")):
                return c
    return None


@dataclass(frozen=True)
class Method:
    """What a probe run trains: ``components`` (method names of injectable parts, and ``lora``)
    and, with LoRA, an optional ``lora_match`` method whose parameter count the LoRA rank is
    solved to match."""

    components: frozenset[str]
    lora_match: Method | None = None

    @property
    def name(self) -> str:
        """Canonical spelling: components in registry order, then lora, then ``@target``."""
        if not self.components:
            return FROZEN
        base = "+".join(c for c in component_names() if c in self.components)
        return f"{base}@{self.lora_match.name}" if self.lora_match is not None else base

    @property
    def frozen(self) -> bool:
        return not self.components

    @property
    def injects(self) -> list[Component]:
        """The attnlab parts (everything except LoRA), in hook order."""
        return [c for c in components() if c.name in self.components]

    def has(self, component: str) -> bool:
        return component in self.components

    def __str__(self) -> str:
        return self.name


def _component(token: str, text: str) -> str:
    key = token.strip().lower()
    if key == LORA:
        return LORA
    if key in _FROZEN_ALIASES:
        raise MethodError(f"method {text!r}: 'frozen' trains nothing and cannot be combined")
    found = find_component(key)
    if found is not None:
        return found.name
    names = component_names()
    near = difflib.get_close_matches(key, [*names, FROZEN], n=1, cutoff=0.5)
    hint = f"did you mean {near[0]!r}? " if near else ""
    raise MethodError(
        f"method {text!r}: unknown component {token.strip()!r}; {hint}"
        f"components: {', '.join(names)} (joined with '+'), or 'frozen'. A plugin's part is "
        "loaded with --plugin FILE.py or plugins = [...] in the probe file"
    )


def parse_method(text: str) -> Method:
    """``"preproj+skip"`` -> ``Method({"preproj", "skip"})``; raises :class:`MethodError`."""
    if not isinstance(text, str) or not text.strip():
        raise MethodError("empty method: give e.g. 'frozen', 'lora', 'preproj+skip'")
    raw = text.strip()
    if raw.lower() in _FROZEN_ALIASES:
        return Method(frozenset())
    body, sep, target = raw.partition("@")
    tokens = re.split(r"\s*\+\s*", body)
    if any(not t.strip() for t in tokens):
        raise MethodError(f"method {raw!r} has an empty component (a stray '+')")
    comps = [_component(t, raw) for t in tokens]
    dup = sorted({c for c in comps if comps.count(c) > 1})
    if dup:
        raise MethodError(f"method {raw!r} names {', '.join(dup)} twice")
    slots: dict[str, str] = {}
    for c in components():
        if c.name in comps:
            if c.slot in slots:
                raise MethodError(
                    f"method {raw!r} puts {slots[c.slot]!r} and {c.name!r} in the same slot "
                    f"({c.slot}); choose one"
                )
            slots[c.slot] = c.name
    match = None
    if sep:
        if LORA not in comps:
            raise MethodError(
                f"method {raw!r}: '@{target}' sets the LoRA rank to match a parameter count, "
                "so the method needs 'lora' (e.g. 'lora@preproj+skip')"
            )
        if "@" in target:
            raise MethodError(f"method {raw!r} has more than one '@'")
        match = parse_method(target)
        if match.frozen:
            raise MethodError(f"method {raw!r}: cannot match the 0 parameters of 'frozen'")
        if match.lora_match is not None:
            raise MethodError(f"method {raw!r}: the '@' target must not itself use '@'")
    return Method(frozenset(comps), match)


def method_slug(method: Method) -> str:
    """A file-name-safe form of the method name (``lora@preproj+skip`` -> ``lora-at-preproj-skip``)."""
    return method.name.replace("@", "-at-").replace("+", "-")
