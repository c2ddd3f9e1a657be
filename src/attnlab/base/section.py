"""The strict base of every config table (:class:`Section`).

It needs only pydantic, so every typed config (the model's parts, the training recipe, the probe,
experiment files) can build on it without importing the part registry.
"""

from __future__ import annotations

from typing import Any, get_args

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

#: the largest integer any config field takes (torch sizes and seeds are int64)
INT_MAX = 2**63 - 1


def _scalar_kinds(annotation: Any) -> set[type]:
    """The scalar types among ``int``, ``float`` and ``bool`` a field annotation admits."""
    args = get_args(annotation) or (annotation,)
    return {a for a in args if a in (int, float, bool)}


class Section(BaseModel):
    """Base of every config table: unknown keys are errors, assignment is validated, floats must
    be finite, ``true``/``false`` is no number and a number no ``true``/``false``, and integers
    fit in int64."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _strict_numbers(cls, v: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        kinds = _scalar_kinds(field.annotation) if field is not None else set()
        if kinds == {bool}:
            if not isinstance(v, bool):
                raise PydanticCustomError("bool_expected", "give true or false")
            return v
        if not kinds:
            return v
        if isinstance(v, bool):
            raise PydanticCustomError("bool_not_number", "a boolean is not a number; give a number")
        if isinstance(v, int) and abs(v) > INT_MAX:
            raise PydanticCustomError("int_too_large", f"too large; at most {INT_MAX} (int64)")
        return v
