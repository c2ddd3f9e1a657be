"""The strict base of every config table (:class:`Section`).

It needs only pydantic, so every typed config (the model's parts, the training recipe, the probe,
experiment files) can build on it without importing the part registry.
"""

from __future__ import annotations

from typing import Annotated, Any, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

#: the largest integer any config field takes (torch sizes are int64)
INT_MAX = 2**63 - 1
#: the largest seed: every generator a seed feeds takes it (numpy's legacy RandomState stops
#: here; torch.manual_seed at 2**64 - 1, and a derived seed such as BigBird's
#: ``seed * 1_000_003 + block`` must still fit)
SEED_MAX = 2**32 - 1


def _seed_in_range(v: int) -> int:
    if not 0 <= v <= SEED_MAX:
        raise PydanticCustomError(
            "seed_range",
            "a seed is an integer from 0 to {top} (2**32 - 1, what numpy's and torch's "
            "generators all take); choose one in that range",
            {"top": SEED_MAX},
        )
    return v


def seed_type(description: str) -> Any:
    """The annotation of a config integer that seeds a random generator: 0..:data:`SEED_MAX`,
    refused outside it with the range named."""
    return Annotated[int, AfterValidator(_seed_in_range), Field(description=description)]


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
