"""PPOConfig: the `trl:` block of a `ppo` stage, extending `TrainingArguments` as TRL's configs do.

Batch shape (per rank): a rollout is `per_device_train_batch_size * gradient_accumulation_steps *
num_mini_batches` prompts, one completion each. Each rollout is trained on for `num_ppo_epochs` passes of
`num_mini_batches` optimizer steps, so `max_steps` counts optimizer steps as in every other stage. The
names follow TRL's last PPOConfig where it had the setting (`num_ppo_epochs`, `num_mini_batches`,
`kl_coef`, `cliprange`, `vf_coef`, `gamma`, `lam`, `whiten_rewards`, `missing_eos_penalty`).
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import TrainingArguments


@dataclass
class PPOConfig(TrainingArguments):
    """PPO settings on top of the Trainer's; see the module docstring for the batch shape."""

    num_ppo_epochs: int = 4
    num_mini_batches: int = 1
    max_completion_length: int = 64
    temperature: float = 0.7
    top_k: int = 0  # refused unless 0: see __post_init__
    top_p: float = 1.0  # refused unless 1.0
    stop_token: str | None = "eos"  # "eos": a completion ends at the tokenizer's EOS; None: full length
    missing_eos_penalty: float | None = 1.0  # off a completion that never ended (stop_token "eos")
    kl_coef: float = 0.05  # the KL penalty's starting weight
    kl_target: float | None = None  # when set, the adaptive controller steers the KL per sequence to it
    kl_horizon: int = 10_000  # how many rollout samples the adaptive controller takes to correct an error
    cliprange: float = 0.2
    cliprange_value: float = 0.2
    vf_coef: float = 0.1
    gamma: float = 1.0
    lam: float = 0.95
    whiten_rewards: bool = False
    forward_batch_size: int = 64  # rows per no-grad forward while scoring a rollout

    def __post_init__(self) -> None:
        super().__post_init__()
        positive = ("num_ppo_epochs", "num_mini_batches", "max_completion_length", "forward_batch_size")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be 1 or more (got {getattr(self, name)})")
        for name in ("temperature", "cliprange", "cliprange_value", "kl_horizon"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be above 0 (got {getattr(self, name)})")
        for name in ("gamma", "lam"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be between 0 and 1 (got {getattr(self, name)})")
        if self.top_k != 0 or self.top_p != 1.0:
            raise ValueError(
                f"top_k/top_p (got {self.top_k}/{self.top_p}): PPO scores its samples under the full softmax "
                "at `temperature`, so truncated sampling would make its log-probs and KL those of another "
                "distribution; leave top_k at 0 and top_p at 1.0, and use temperature"
            )
        if self.kl_coef < 0 or (self.kl_target is not None and self.kl_target <= 0):
            raise ValueError("kl_coef must be 0 or more, and kl_target above 0 when set")
        if self.stop_token not in ("eos", None):
            raise ValueError(f"stop_token must be 'eos' or null (got {self.stop_token!r})")

    @property
    def rollout_batch_size(self) -> int:
        """Prompts per rank per rollout."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps * self.num_mini_batches

    @property
    def micro_batches_per_rollout(self) -> int:
        """Trainer steps (forward and backward on one micro-batch) spent on one rollout."""
        return self.num_ppo_epochs * self.num_mini_batches * self.gradient_accumulation_steps
