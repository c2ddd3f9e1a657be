"""Probe methods by name: a set of components, parsed from strings such as ``preproj+skip``.

Grammar: ``COMPONENT("+"COMPONENT)*["@"TARGET]`` or ``frozen``. Components (aliases in brackets):

==================  ==================================================================  ============
component           what is injected into every attention block                         params/layer
==================  ==================================================================  ============
``preproj``         x~ = x^ + W_down act(W_up x^), Q/K/V read x~ [pre-projection]       2 e d^2
``skip``            out = x + attn + W_skip x~ [content-skip]                           d^2
``anchored-query``  q = u W_Q + f(u), f(u) = LN(act(RMSNorm(u) W1) W2) [anchored]       2 d r + O(d)
``lora``            PEFT LoRA on the attention projections (q/k/v/o by default)         r (in + out)
==================  ==================================================================  ============

``@TARGET`` (only with ``lora``) solves the LoRA rank so the method's *actual* trainable count
(counted after ``get_peft_model``) matches the method ``TARGET``'s count on the same base:
``lora@preproj+skip`` is LoRA as large as pre-projection + content skip, ``preproj+lora@preproj+skip``
spends the rest of that budget on LoRA. ``frozen`` trains nothing (the base evaluated as is).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

COMPONENTS = ("preproj", "skip", "anchored-query", "lora")
ALIASES = {
    "preproj": "preproj",
    "pre-proj": "preproj",
    "pre-projection": "preproj",
    "pre_projection": "preproj",
    "preprojection": "preproj",
    "skip": "skip",
    "content-skip": "skip",
    "content_skip": "skip",
    "anchored-query": "anchored-query",
    "anchored_query": "anchored-query",
    "anchored": "anchored-query",
    "lora": "lora",
}
FROZEN = "frozen"
_FROZEN_ALIASES = ("frozen", "baseline", "none")


class MethodError(ValueError):
    """A method string that cannot be parsed; the message names the part and the fix."""


@dataclass(frozen=True)
class Method:
    """What a probe run trains: ``components`` (a subset of :data:`COMPONENTS`) and, with LoRA,
    an optional ``lora_match`` method whose parameter count the LoRA rank is solved to match."""

    components: frozenset[str]
    lora_match: Method | None = None

    @property
    def name(self) -> str:
        """Canonical spelling: components in :data:`COMPONENTS` order, then ``@target``."""
        if not self.components:
            return FROZEN
        base = "+".join(c for c in COMPONENTS if c in self.components)
        return f"{base}@{self.lora_match.name}" if self.lora_match is not None else base

    @property
    def frozen(self) -> bool:
        return not self.components

    @property
    def injects(self) -> frozenset[str]:
        """The attnlab parts (everything except LoRA)."""
        return self.components - {"lora"}

    def has(self, component: str) -> bool:
        return component in self.components

    def __str__(self) -> str:
        return self.name


def _component(token: str, text: str) -> str:
    key = token.strip().lower()
    if key in ALIASES:
        return ALIASES[key]
    if key in _FROZEN_ALIASES:
        raise MethodError(f"method {text!r}: 'frozen' trains nothing and cannot be combined")
    near = difflib.get_close_matches(key, [*ALIASES, FROZEN], n=1, cutoff=0.5)
    hint = f"did you mean {near[0]!r}? " if near else ""
    raise MethodError(
        f"method {text!r}: unknown component {token.strip()!r}; {hint}"
        f"components: {', '.join(COMPONENTS)} (joined with '+'), or 'frozen'"
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
    match = None
    if sep:
        if "lora" not in comps:
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
