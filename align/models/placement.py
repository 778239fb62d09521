"""Where a stage's models live, as values: the roles, where a pipeline file may place a frozen one, how the
training ranks hold one, and the table from role and backend to that. Here, in the lowest package that
needs them (the memory plan counts frozen models by how they are held), so that config, the plan, the
stages and the driver all name one set of values; the plan reads the table once (planning/placement.py).
"""

from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    """What a model is to its stage."""

    POLICY = "policy"  # the model being trained
    REFERENCE = "reference"  # DPO's reference, the KL reference of PPO/GRPO/RLOO
    REWARD = "reward"  # a reward model (`rewards[i].model`)
    VALUE = "value"  # PPO's critic
    TEACHER = "teacher"  # a distill stage's teacher


class Placement(StrEnum):
    """Where a frozen model runs, as a pipeline file writes it (`placement:` of a reward model, a reference
    or a teacher): on every training rank beside the policy, or in a Ray actor of its own that the ranks
    call (align/planning/services.py names what they call)."""

    WITH_POLICY = "with_policy"
    ACTOR = "actor"


class Held(StrEnum):
    """How a model on the training ranks is held: whole on every rank, sharded over them like the policy
    (FSDP), or in host memory."""

    REPLICATED = "replicated"
    SHARDED = "sharded"
    CPU = "cpu"


SCORES_BESIDE_THE_POLICY = ("ppo",)
"""The kinds whose reward models are held like the policy's frozen copies: align's PPO scores every rank's
rollouts in its own step. GRPO and RLOO score inside TRL's loop, one rank at a time, with each reward model
whole on the rank."""


def held(role: Role, frozen_sharded: bool, kind: str) -> Held:
    """The table: how a model of `role` is held on each training rank of a `kind` stage under a backend that
    shards frozen copies like the policy (`Backend.frozen_sharded`: fsdp) or not (ddp, zero2).

    | role      | frozen_sharded | otherwise  |
    | policy    | sharded        | replicated |  (its weights; zero2 partitions the rest of its states)
    | value     | sharded        | replicated |  (a head on the policy's trunk, or an adapter on its base)
    | reference | sharded        | replicated |  (a frozen copy, as TRL prepares one)
    | teacher   | sharded        | replicated |  (held as a reference copy is)
    | reward    | sharded        | replicated |  (PPO; GRPO and RLOO: replicated under every backend)

    A frozen model placed `actor` is on no rank (its own actor holds it whole); a LoRA stage's reference is
    the policy itself with its adapters disabled, a precomputed one no model at all (planning/placement.py).
    """
    if role is Role.REWARD and kind not in SCORES_BESIDE_THE_POLICY:
        return Held.REPLICATED
    return Held.SHARDED if frozen_sharded else Held.REPLICATED
