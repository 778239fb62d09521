"""A distill stage's `teacher:`: the frozen model whose next-token distribution the student learns, and
where it runs. Written as a model value (`teacher: ${stages.sft.output}`), or as a block with its
placement (`teacher: {model: ..., placement: actor}`, which validate refuses with the measured cost)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from align.config.strict import Strict
from align.models.placement import Placement


class TeacherSpec(Strict):
    """The teacher: a stage's output (`${stages.X.output}`), a model folder, a builtin or a hub id."""

    model: str
    placement: Placement = Field(default=Placement.WITH_POLICY, exclude=True)
    """Where it runs changes nothing it computes, so it is left out of the stage's fingerprint."""

    @model_validator(mode="before")
    @classmethod
    def from_model_value(cls, value: Any) -> Any:
        """`teacher: X` is `teacher: {model: X}`."""
        return {"model": value} if isinstance(value, str) else value

    @property
    def as_actor(self) -> bool:
        return self.placement == Placement.ACTOR
