"""The base of every block of the pipeline file."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def takes_a_number(annotation: Any) -> bool:
    """Whether a field's type is a number (or an optional one) and not also a boolean."""
    if typing.get_origin(annotation) is typing.Annotated:
        return takes_a_number(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        options = typing.get_args(annotation)
        return bool not in options and any(map(takes_a_number, options))
    return annotation in (int, float)


class Strict(BaseModel):
    """Base for every block of the pipeline file: unknown keys are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def no_boolean_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        """YAML reads `yes`, `no`, `on` and `off` as booleans, and pydantic would take True as 1: a number
        written as a word is refused, not trained with."""
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and takes_a_number(field.annotation):
            raise ValueError(f"a number is needed here, not the YAML boolean {str(value).lower()}")
        return value
