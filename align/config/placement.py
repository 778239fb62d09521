"""Where a stage's frozen models run, as the pipeline file says it: beside the policy on every training
rank (the default), or in a Ray actor of their own (`placement: actor`) that the ranks call."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from align.config.strict import Strict
from align.models.placement import Placement

ACTOR_REFERENCE_KINDS = ("ppo", "dpo")
"""The kinds whose reference copy may move to an actor: PPO's (per-token log-probs of each rollout) and
DPO's (log-probs of every pair, computed before training)."""
ACTOR_REWARD_KINDS = ("ppo", "grpo", "rloo")


class ServiceResources(BaseModel):
    """What a frozen model placed in its own Ray actor (`placement: actor`: a reward model, a reference)
    asks Ray for. Defaults: on an embedded Ray, where the ranks already share this machine's cores, no CPU
    of its own (0, so it can start at all); on a cluster 1 CPU; and 1 GPU where the plan has GPUs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpus: float | None = Field(default=None, ge=0)
    gpus: float | None = Field(default=None, ge=0)
    wait_s: float = Field(default=600.0, gt=0)  # for it to start and load its model, then one clear line


class ReferenceSpec(Strict):
    """A stage's `reference:` block: `placement: actor` loads the frozen reference copy in its own Ray actor,
    with its own `resources:`, instead of on every training rank."""

    placement: Placement = Placement.WITH_POLICY
    resources: ServiceResources = ServiceResources()

    @property
    def as_actor(self) -> bool:
        return self.placement == Placement.ACTOR
