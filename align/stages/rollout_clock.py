"""Where GRPO's and RLOO's train loop goes: generating, scoring, updating, as PPO records it.

TRL times these steps only for W&B, MLflow or Trackio; align wraps two of the trainer's own methods on
the instance instead: `_generate` (sampling the completions) and `_generate_and_score_completions` (that,
then the rewards and the old and reference log-probs). What remains of the train loop is the update.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from align.trainers.sampling import synced_clock, time_split


class RolloutClock:
    """Seconds a GRPO/RLOO trainer spends in each part of its rollouts, summed over a `train()`."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.seconds = {"generate": 0.0, "rollout": 0.0}
        for method, part in (("_generate", "generate"), ("_generate_and_score_completions", "rollout")):
            setattr(trainer, method, self.timed(getattr(trainer, method), part))

    def timed(self, method: Callable[..., Any], part: str) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            started = synced_clock()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds[part] += synced_clock() - started

        return run

    def split(self) -> dict[str, float]:
        """`time_generate_s`, `time_score_s`, `time_update_s` of the last `train()`, as PPO records them."""
        generate, rollout = self.seconds["generate"], self.seconds["rollout"]
        return time_split(self.trainer, generate, max(rollout - generate, 0.0))
