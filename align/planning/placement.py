"""Where each model of a stage lives (policy, reference, reward models, value), decided per backend.

This is the one place that decides it: `align plan` prints it, the memory plan counts it, and the
stage runners follow it by reading `Placement`'s fields instead of testing the backend. How each role is
held per backend is align/models/placement.py's table (`held`), read here once per stage.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from align.backends import Backend
from align.config.spec import (
    KINDS,
    DistillStage,
    EvalStage,
    PPOStage,
    RewardedStage,
    StageBase,
    TrainingStage,
)
from align.models.memory import FrozenModel
from align.models.placement import Held, Role, held
from align.models.placement import Placement as Where
from align.pipeline.graph import reference_target
from align.pipeline.trl_args import trl_setting
from align.planning.services import Service


class Reference(StrEnum):
    """What a stage's reference is: how its log-probs are had."""

    NONE = "none"  # the stage uses none
    ADAPTERS_DISABLED = "adapters-disabled"  # LoRA: the policy's base with its adapters off, no copy
    COPY = "frozen-copy"  # a frozen copy on the ranks, held as `held(Role.REFERENCE, ...)` says
    PRECOMPUTED = "precomputed"  # log-probs from the policy before its first step, no copy
    ACTOR = "actor"  # a frozen copy in a Ray actor of its own, called by the ranks


REFERENCE_NONE = Reference.NONE
REFERENCE_ADAPTERS_DISABLED = Reference.ADAPTERS_DISABLED
REFERENCE_COPY = Reference.COPY
REFERENCE_PRECOMPUTED = Reference.PRECOMPUTED
REFERENCE_ACTOR = Reference.ACTOR

REWARD_MODELS_NONE = None  # no `model:` among the rewards on the ranks: functions cost no model memory
REWARD_MODELS_REPLICATED = Held.REPLICATED
REWARD_MODELS_SHARDED = Held.SHARDED

TEACHER_NONE = None
TEACHER_WITH_POLICY = Where.WITH_POLICY  # a distill stage's teacher, frozen beside the student on every rank

VALUE_NONE = "none"
VALUE_HEAD = "head"
VALUE_ADAPTER = "adapter"

REPLICATED = "replicated on every rank"
HELD_WORDS = {Held.REPLICATED: REPLICATED, Held.SHARDED: "sharded like the policy"}
"""How `align plan` says a frozen model on the ranks is held."""

VALUE_DESCRIPTIONS = {
    VALUE_HEAD: "a value head (hidden -> 1) on the policy's own trunk, trained with the policy: "
    "one forward gives logits and values",
    VALUE_ADAPTER: "its own LoRA adapter (the policy's r and targets) and a value head on the policy's "
    "frozen base (no second base), trained with the policy in one optimizer",
}


@dataclass(frozen=True)
class Placement:
    """For each model role, how it is held: runners act on the fields, people read `description`.

    reference: the DPO reference or the KL reference of PPO/GRPO/RLOO.
    reward_models: how every `rewards[i].model` on the ranks is held, each frozen; None: none on them.
    value: VALUE_*, the PPO critic (`value:` of the stage).
    teacher: a distill stage's teacher, `with_policy` (held like a reference copy, sharded under fsdp);
    None: no teacher.
    actor_rewards: the indices in `rewards:` of the reward models in Ray actors of their own.
    services: each frozen model in an actor of its own, with what it asks Ray for (filled in by the plan).
    """

    policy: str
    reference: Reference
    description: dict[str, str]
    reward_models: Held | None = REWARD_MODELS_NONE
    value: str = VALUE_NONE
    teacher: Where | None = TEACHER_NONE
    actor_rewards: tuple[int, ...] = ()
    services: tuple[Service, ...] = ()


def frozen_held(backend: Backend, role: Role = Role.REFERENCE, kind: str = "") -> str:
    """How a frozen model (a reference copy, a reward model) is held alongside the policy, in words, as the
    table says: as TRL prepares a reference, DeepSpeed below stage 3 and DDP keep it whole, FSDP shards it."""
    return HELD_WORDS[held(role, backend.frozen_sharded, kind)]


def policy_placement(backend: Backend, lora: bool, quantize_4bit: bool) -> str:
    """How the trained model is held on each rank."""
    base = "4-bit NF4 base + LoRA adapters" if quantize_4bit else ("base + LoRA adapters" if lora else "full")
    if lora and backend.frozen_sharded:  # peft adds the adapters after the base was sharded at load
        return f"{base}, the frozen base sharded; adapters, their grads and optimizer states on every rank"
    return f"{base}, {backend.policy_held}"


def plan_placement(stage: StageBase, backend: Backend, precompute: bool = False) -> Placement:
    """The placement of every model a stage uses under one backend.

    `precompute` (offline preference kinds: DPO, KTO): the full-parameter reference is replaced by log-probs
    computed from the policy before its first step (when it still is the reference), so no copy is kept
    during training. Online RL (data kind `prompts`) needs the reference on each rollout's new
    completions, so theirs stays.
    """
    if isinstance(stage, EvalStage):  # no policy: each named model in turn, whole on every rank
        described = {"models": f"{', '.join(stage.models)}: each whole on every rank, one at a time"}
        held = REWARD_MODELS_NONE
        if stage.rewards:
            held, described["rewards"] = reward_placement(stage, backend)
        return Placement("whole", REFERENCE_NONE, described, held, VALUE_NONE)
    lora = isinstance(stage, TrainingStage) and stage.lora is not None
    policy = policy_placement(backend, lora, lora and stage.lora.load_in_4bit)
    description = {"policy": policy}
    reference = REFERENCE_NONE
    if uses_reference(stage) and stage.reference is not None and stage.reference.as_actor:
        reference, description["reference"] = REFERENCE_ACTOR, "frozen copy in a Ray actor of its own"
    elif uses_reference(stage):
        reference, description["reference"] = reference_placement(
            backend, lora, precompute and KINDS[stage.kind].data != "prompts"
        )
    reward_models, actors = REWARD_MODELS_NONE, ()
    if isinstance(stage, RewardedStage):
        reward_models, description["rewards"] = reward_placement(stage, backend)
        actors = tuple(index for index, reward in enumerate(stage.rewards) if reward.as_actor)
    value = VALUE_NONE
    if isinstance(stage, PPOStage):
        value = stage.value
        description["value"] = VALUE_DESCRIPTIONS[value]
    teacher = TEACHER_NONE
    if isinstance(stage, DistillStage):
        teacher = TEACHER_WITH_POLICY
        target = reference_target(stage.teacher.model)
        source = f"stage {target}'s output" if target else stage.teacher.model
        where = frozen_held(backend, Role.TEACHER, stage.kind)
        description["teacher"] = (
            f"{source}, frozen, in the compute dtype, {where} (per rank: the `teacher` row)"
        )
    return Placement(policy, reference, description, reward_models, value, teacher, actors)


def uses_reference(stage: StageBase) -> bool:
    """As the kinds table says: DPO, KTO and PPO always; GRPO and RLOO only with a KL term (`beta` > 0)."""
    rule = KINDS[stage.kind].reference
    return rule == "always" or (rule == "with_kl" and trl_setting(stage.kind, stage.trl, "beta") > 0)


def reference_placement(backend: Backend, lora: bool, precompute: bool) -> tuple[Reference, str]:
    """(what the reference is, in words) for a stage that uses a reference."""
    if lora:
        return REFERENCE_ADAPTERS_DISABLED, "the policy's base with adapters disabled (no copy)"
    if precompute and not backend.frozen_sharded:
        return REFERENCE_PRECOMPUTED, "log-probs precomputed from the policy before training (no copy)"
    return REFERENCE_COPY, f"frozen copy, {frozen_held(backend)}"


def reward_placement(stage: RewardedStage, backend: Backend) -> tuple[Held | None, str]:
    """(how the reward models on the ranks are held, each reward in words), as the table says: align's PPO
    holds reward models like a reference copy (sharded under fsdp); GRPO/RLOO score inside TRL's loop, one
    rank at a time, so each rank keeps its reward models whole."""
    on_ranks = held(Role.REWARD, backend.frozen_sharded, stage.kind)
    words = [
        f"rewards[{index}] {reward.model}: frozen reward model, "
        + ("in a Ray actor of its own" if reward.as_actor else HELD_WORDS[on_ranks])
        if reward.model is not None
        else f"rewards[{index}] {reward.function}: a function (no model memory)"
        for index, reward in enumerate(stage.rewards)
    ]
    if all(reward.model is None or reward.as_actor for reward in stage.rewards):
        return REWARD_MODELS_NONE, "; ".join(words)
    return on_ranks, "; ".join(words)


def frozen_models(
    placement: Placement,
    param_count: int,
    dtype: str,
    reward_params: dict[int, int] | None = None,
    teacher_params: int = 0,
) -> tuple[FrozenModel, ...]:
    """The frozen models the memory plan must count for this placement, each held with the policy.

    param_count: the policy's, which a reference copy shares. reward_params: each reward model's
    parameter count by its index in `rewards:`. teacher_params: a distill stage's teacher's, held as a
    reference copy is (sharded under fsdp, whole on every rank otherwise). A model in an actor of its own
    is not on the ranks.
    """
    copy = placement.reference == REFERENCE_COPY
    reference = (FrozenModel("reference", param_count, dtype),) if copy else ()
    on_ranks = placement.reward_models or Held.REPLICATED
    counts = [(i, n) for i, n in (reward_params or {}).items() if i not in placement.actor_rewards]
    rewards = tuple(FrozenModel(f"rewards[{i}]", count, dtype, placement=on_ranks) for i, count in counts)
    with_teacher = placement.teacher == TEACHER_WITH_POLICY and teacher_params
    teacher = (FrozenModel("teacher", teacher_params, dtype),) if with_teacher else ()
    return reference + rewards + teacher


def with_services(placement: Placement, services: tuple[Service, ...]) -> Placement:
    """The placement with its actor-placed models, each with a line of its own for `align plan`."""
    lines = {f"{each.role} service": each.describe() for each in services}
    return replace(placement, services=services, description={**placement.description, **lines})
