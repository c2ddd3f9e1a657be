"""Task items, validated before anything is scored: strict types, no coercion.

Every row of a task file is checked by a pydantic model in strict mode: a choice index is a JSON
integer (``1.7``, ``true``, ``Infinity`` are refused, not read as 1), a list of choices is a JSON
list of strings (a string or an object is refused, not split into characters or keys), a text is
a string (``null`` is refused, not read as ``"None"``). What types cannot say (an index within the
choices, an answer key among the labels) is checked after. A wrong item is refused naming the
file, its line, the item's 0-based index, the field, the value and what the field must be.

Fields a row has beyond its format's are ignored (task files carry ids and sources).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from attnlab.base.errors import UserError
from attnlab.config import cut_repr
from attnlab.eval.sources import read_jsonl_lines

#: a text field's description (what a refusal says it must be)
TEXT = "a string"
CHOICES = 'a non-empty list of strings, e.g. ["yes", "no"]'


class ItemError(UserError):
    """One item cannot be used as its format says; the message names the field and the fix."""


class Row(BaseModel):
    """Base of a task item: strict types (no coercion), other fields ignored, immutable."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class ArcChoices(Row):
    """ARC's choices: parallel lists of texts and labels."""

    text: list[str] = Field(min_length=1, description=CHOICES)
    label: list[str] = Field(min_length=1, description='a list of label strings, e.g. ["A", "B"]')


class ClozeRow(Row):
    """LAMBADA: the passage, whose last word is the target."""

    text: str = Field(description=TEXT)


class TextRow(Row):
    """A document for perplexity."""

    text: str = Field(description=TEXT)


class HellaswagRow(Row):
    """The official HellaSwag JSONL (``ctx_a`` + ``ctx_b``, or ``ctx``)."""

    ctx_a: str = Field(None, description=TEXT)  # type: ignore[assignment]  (absent: use ctx)
    ctx_b: str = Field("", description=TEXT)
    ctx: str = Field(None, description=TEXT)  # type: ignore[assignment]
    activity_label: str = Field("", description=TEXT)
    endings: list[str] = Field(min_length=1, description=CHOICES)
    label: int | str = Field(description="the index of the right ending: an integer, or digits")


class ArcRow(Row):
    """ARC: a question, labelled choices and the right label."""

    question: str = Field(description=TEXT)
    choices: ArcChoices = Field(
        description='an object {"text": [...], "label": [...]} of equal-length lists'
    )
    answerKey: str = Field(description='the label of the right choice, e.g. "B"')  # noqa: N815


class McRow(Row):
    """Generic multiple choice (after the file's field names are mapped to these three)."""

    query: str = Field(description=TEXT)
    choices: list[str] | ArcChoices = Field(
        union_mode="left_to_right",
        description=f'{CHOICES}, or ARC\'s {{"text": [...], "label": [...]}}',
    )
    gold: int | str = Field(
        union_mode="left_to_right",
        description="the right choice: its 0-based index (an integer or digits), its letter "
        '("A" = 0), or its label in ARC-style choices',
    )


def validate_row(model: type[Row], row: Mapping[str, Any], names: Mapping[str, str] | None = None):
    """``row`` as ``model``, or :class:`ItemError` naming each wrong field (``names`` maps a
    model field to the file's name for it, e.g. ``gold`` -> ``label``)."""
    names = names or {}
    try:
        return model.model_validate(dict(row))
    except ValidationError as e:
        problems: dict[str, str] = {}
        for err in e.errors():
            field = str(err["loc"][0]) if err["loc"] else ""
            if field in problems:
                continue  # a union reports each alternative; one line per field
            problems[field] = _field_problem(model, field, row, err, names)
        raise ItemError("; ".join(problems.values())) from None


def _field_problem(
    model: type[Row], field: str, row: Mapping[str, Any], err: Any, names: Mapping[str, str]
) -> str:
    info = model.model_fields.get(field)
    want = info.description if info is not None and info.description else err["msg"]
    shown = names.get(field, field)
    if err["type"] == "missing":
        return f"field {shown!r} is missing; it must be {want}"
    value = row.get(shown, row.get(field))
    where = [p for p in err["loc"][1:] if isinstance(p, int)]
    part = f" (element {where[0]} is not)" if where and err["type"] != "too_short" else ""
    return f"field {shown!r} = {cut_repr(value)}: it must be {want}{part}"


def choice_index(
    gold: int | str,
    choices: list[str],
    field: str,
    labels: list[str] | None = None,
    letters: bool = True,
) -> int:
    """The 0-based index ``gold`` names: an integer or digits; with ``labels``, one of them;
    else (with ``letters``) a letter, ``"A"`` = 0. Unknown or out of range: :class:`ItemError`."""
    n = len(choices)
    if isinstance(gold, str) and labels is not None:
        if gold not in labels:
            raise ItemError(f"field {field!r} = {gold!r} is not one of the choice labels {labels}")
        index = labels.index(gold)
    elif isinstance(gold, str) and gold.isascii() and gold.isdigit():
        index = int(gold)
    elif isinstance(gold, str) and letters and len(gold) == 1 and "A" <= gold <= "Z":
        index = ord(gold) - ord("A")
    elif isinstance(gold, int):
        index = gold
    else:
        letter = " or its letter (A = the first)" if letters else ""
        raise ItemError(
            f"field {field!r} = {gold!r} names no choice; give its 0-based index (0..{n - 1})"
            f"{letter}"
        )
    if not 0 <= index < n:
        raise ItemError(f"field {field!r} = {gold!r} is out of range for {n} choices (0..{n - 1})")
    return index


def read_items(path: str | Path, make: Any, limit: int | None = None) -> list[Any]:
    """``make(row)`` of every row of a JSON-lines file (checked, then cut to ``limit``); an item
    ``make`` refuses is named by file, line and 0-based index."""
    rows = read_jsonl_lines(path)
    out = []
    for index, (line, row) in enumerate(rows):
        try:
            out.append(make(row))
        except ItemError as e:
            raise ItemError(
                f"{path}:{line}: item {index} (0-based): {e}; fix or remove that line"
            ) from None
    return out[:limit]
