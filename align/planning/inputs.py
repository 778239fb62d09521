"""The folders a stage reads, as the driver resolves them when it starts the stage (align/run/inputs.py):
part of what launching adds to a plan (align/planning/launch.py), never a planning decision."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ModelInput:
    """A stage's input model: a base folder plus the adapters to apply on it, in order."""

    base: str
    adapters: tuple[str, ...] = ()


@dataclass(frozen=True)
class StageInputs:
    """The folders a stage reads, resolved on the driver from builtins, paths and upstream records:
    its model, each reward model by its index in `rewards:`, an eval stage's named models, and a distill
    stage's teacher."""

    model: ModelInput
    reward_models: dict[int, str] = field(default_factory=dict)
    models: dict[str, ModelInput] = field(default_factory=dict)  # an eval stage's, by name
    teacher: ModelInput | None = None
