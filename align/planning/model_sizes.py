"""The sizes of a stage's models, read before anything loads: the root model a chain of stage references
starts from, its architecture (config.json or a preset), and the frozen models beside the policy (reward
models, a distill stage's teacher) counted for the memory plan."""

from __future__ import annotations

from align.cache import cache_root
from align.config.spec import DistillStage, Pipeline, RewardedStage
from align.models.architectures import Architecture, architecture_for
from align.pipeline.graph import reference_target


def root_model(pipeline: Pipeline, name: str) -> str:
    """The base model at the root of a chain of stage references (its architecture is the stage's)."""
    value = pipeline.stage_model(name)
    target = reference_target(value)
    return root_model(pipeline, target) if target else value


def stage_architecture(pipeline: Pipeline, name: str) -> Architecture | None:
    """The architecture of a stage's model from its config or a preset; a builtin once it is cached."""
    return model_architecture(root_model(pipeline, name))


def model_architecture(source: str) -> Architecture | None:
    """The architecture of a model folder or hub id from its config or a preset; a builtin once cached."""
    cached = cache_root() / "models" / source
    return architecture_for(str(cached) if cached.is_dir() else source)


def reward_model_params(pipeline: Pipeline, name: str, policy: Architecture) -> dict[int, int]:
    """Each reward model's parameter count, by its index in the stage's `rewards:`.

    A reward stage's output is its root model's trunk with a one-label score head; a folder or hub id
    counts by its config.json or a preset. One whose shape is unknown before it is present (a hub id
    without a preset) is assumed to share the policy's trunk.
    """
    stage = pipeline.stages[name]
    if not isinstance(stage, RewardedStage):
        return {}
    counts = {}
    for index, reward in enumerate(stage.rewards):
        if reward.model is not None:
            target = reference_target(reward.model)
            shape = stage_architecture(pipeline, target) if target else model_architecture(reward.model)
            counts[index] = (shape or policy).reward_model_param_count()
    return counts


def teacher_params(pipeline: Pipeline, name: str, policy: Architecture) -> int:
    """A distill stage's teacher's parameter count (0 for other kinds): a stage's output counts as its root
    model, a folder or hub id by its config.json or a preset; one whose shape is unknown before it is
    present is assumed to be the student's size."""
    stage = pipeline.stages[name]
    if not isinstance(stage, DistillStage):
        return 0
    target = reference_target(stage.teacher.model)
    shape = stage_architecture(pipeline, target) if target else model_architecture(stage.teacher.model)
    return (shape or policy).param_count()
