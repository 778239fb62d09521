"""One item of a stage's `rewards:`: a shipped reward function, a function of your own, or a reward model,
and where a reward model runs. The functions themselves are align/rewards.py's."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from align.config.placement import ServiceResources
from align.models.placement import Placement


class RewardSpec(BaseModel):
    """One reward of a grpo/rloo stage: a shipped function, a function of your own, or a reward model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    function: str | None = None  # a shipped short name, or a dotted path (needs allow_custom_code)
    model: str | None = None  # ${stages.NAME.output} of a reward stage, or a reward model folder
    args: dict[str, Any] = {}
    weight: float = 1.0
    placement: Placement = Field(default=Placement.WITH_POLICY, exclude=True)
    """A reward model's: on every training rank (`with_policy`), or in a Ray actor of its own (`actor`)
    that the ranks send texts to. Where it runs does not change what it computes: left out of the
    stage's fingerprint, as `resources:` is."""
    resources: ServiceResources | None = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def one_source(self) -> RewardSpec:
        if (self.function is None) == (self.model is None):
            raise ValueError("give exactly one of `function` (a reward function) or `model` (a reward model)")
        if self.model is not None and self.args:
            raise ValueError("`args` are a reward function's settings; a reward model takes none")
        if self.function is not None and (self.placement == Placement.ACTOR or self.resources is not None):
            raise ValueError(
                "`placement: actor` and `resources` place a reward *model* in a Ray actor of its own; a "
                "function runs on each training rank: remove them"
            )
        if self.resources is not None and self.placement != Placement.ACTOR:
            raise ValueError("`resources` are for a reward model in its own actor: add `placement: actor`")
        return self

    @property
    def as_actor(self) -> bool:
        return self.placement == Placement.ACTOR
