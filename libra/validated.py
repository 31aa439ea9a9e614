"""The base of every validated settings record (config sections, the planner's settings): unknown
keys are errors, records are frozen, and a number is never given as true or false (pydantic would
read `steps: true` as 1; YAML's yes/no/on/off are booleans too)."""

from __future__ import annotations

import types
import typing

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

_NUMBERS = (int, float)


class Validated(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, value: object, info: ValidationInfo) -> object:
        if isinstance(value, bool) and info.field_name is not None and _numeric(cls.model_fields[info.field_name].annotation):
            raise ValueError(f"a number is needed here, not {str(value).lower()}")
        return value


def _numeric(annotation: object) -> bool:
    """Whether a field holds a number and never a boolean (int, float, or either or None)."""
    if annotation in _NUMBERS:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        arms = [a for a in typing.get_args(annotation) if a is not type(None)]
        return bool(arms) and all(a in _NUMBERS for a in arms)
    return False
