"""`placement: actor` only where a frozen model can move to a Ray actor of its own: a PPO, GRPO or RLOO
reward model, and PPO's or DPO's full-parameter reference copy. Anything else is refused at validate, each
problem naming its key and the fix."""

from __future__ import annotations

from align.config.placement import ACTOR_REFERENCE_KINDS, ACTOR_REWARD_KINDS
from align.config.spec import EvalStage, Pipeline, StageBase, TrainingStage
from align.config.stage_parts import rewards_of
from align.errors import Problem
from align.models.placement import Placement


def placement_problems(pipeline: Pipeline) -> list[Problem]:
    problems = []
    for name, stage in pipeline.stages.items():
        problems += reference_problems(f"stages.{name}", stage)
        problems += reward_placement_problems(f"stages.{name}", stage)
    return problems


def reference_problems(where: str, stage: StageBase) -> list[Problem]:
    """A `reference:` block on a stage whose reference copy can run in an actor, and only then."""
    reference = stage.reference if isinstance(stage, TrainingStage) else None
    if reference is None:
        return []
    if stage.kind not in ACTOR_REFERENCE_KINDS:
        return [
            Problem(
                f"{where}.reference",
                f"a {stage.kind} stage has no reference copy align can move (only "
                f"{' and '.join(ACTOR_REFERENCE_KINDS)} place theirs in an actor): remove `reference:`",
            )
        ]
    if reference.as_actor and stage.lora is not None:
        return [
            Problem(
                f"{where}.reference.placement",
                "with `lora:` the reference is the policy's own base with its adapters disabled, no copy to "
                "move: remove `reference:`, or train full parameters (no `lora:`)",
            )
        ]
    if not reference.as_actor and "resources" in reference.model_fields_set:
        return [Problem(f"{where}.reference.resources", "add `placement: actor`, or remove `resources`")]
    return []


def reward_placement_problems(where: str, stage: StageBase) -> list[Problem]:
    """A reward model in its own actor is for the online RL kinds; an eval stage scores on its own ranks."""
    rewards = rewards_of(stage)
    if stage.kind in ACTOR_REWARD_KINDS and not isinstance(stage, EvalStage):
        return []
    return [
        Problem(
            f"{where}.rewards[{index}].placement",
            f"a {stage.kind} stage scores with its reward models on its own ranks; only "
            f"{', '.join(ACTOR_REWARD_KINDS)} place one in an actor: remove `placement`",
        )
        for index, reward in enumerate(rewards)
        if reward.placement == Placement.ACTOR
    ]
