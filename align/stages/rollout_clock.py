"""Where GRPO's and RLOO's train loop goes: generating, scoring, updating, as PPO records it.

TRL times these steps only for W&B, MLflow or Trackio; align trains a named subclass of the trainer
(`timed`) whose rollout steps, as align/compat/trl.py names them, are timed: `generate` (sampling the
completions) and `rollout` (that, then the rewards and the old and reference log-probs). What remains of
the train loop is the update.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from align.compat.trl import RolloutSteps
from align.trainers.sampling import synced_clock, time_split


class RolloutClock(RolloutSteps):
    """Seconds a GRPO/RLOO trainer spends in each part of its rollouts, summed over a `train()`; put before
    the trainer's class (`timed`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.rollout_seconds = {"generate": 0.0, "rollout": 0.0}
        super().__init__(*args, **kwargs)

    def rollout_step(self, part: str, step: Callable[[], Any]) -> Any:
        started = synced_clock()
        try:
            return step()
        finally:
            self.rollout_seconds[part] += synced_clock() - started

    def rollout_split(self) -> dict[str, float]:
        """`time_generate_s`, `time_score_s`, `time_update_s` of the last `train()`, as PPO records them."""
        generate, rollout = self.rollout_seconds["generate"], self.rollout_seconds["rollout"]
        return time_split(self, generate, max(rollout - generate, 0.0))


def timed(trainer_class: type) -> type:
    """`trainer_class` (TRL's GRPOTrainer or RLOOTrainer) with its rollouts timed, as a named subclass:
    `TimedGRPOTrainer`, `TimedRLOOTrainer`."""
    return type(f"Timed{trainer_class.__name__}", (RolloutClock, trainer_class), {"__module__": __name__})
