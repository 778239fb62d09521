"""Where a stage's frozen models run, as the pipeline file says it: beside the policy on every training
rank (the default), or in a Ray actor of their own (`placement: actor`) that the ranks call."""

from __future__ import annotations

from typing import Literal

from align.config.strict import Strict
from align.rewards import ACTOR, WITH_POLICY, ServiceResources

ACTOR_REFERENCE_KINDS = ("ppo", "dpo")
"""The kinds whose reference copy may move to an actor: PPO's (per-token log-probs of each rollout) and
DPO's (log-probs of every pair, computed before training)."""
ACTOR_REWARD_KINDS = ("ppo", "grpo", "rloo")


class ReferenceSpec(Strict):
    """A stage's `reference:` block: `placement: actor` loads the frozen reference copy in its own Ray actor,
    with its own `resources:`, instead of on every training rank."""

    placement: Literal["with_policy", "actor"] = WITH_POLICY
    resources: ServiceResources = ServiceResources()

    @property
    def as_actor(self) -> bool:
        return self.placement == ACTOR
