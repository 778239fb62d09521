"""The base of every block of the pipeline file."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """Base for every block of the pipeline file: unknown keys are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)
