"""The arithmetic of PPO on token sequences, as plain tensor functions (Schulman et al. 2017; the RLHF
form of Ziegler et al. 2019 and Ouyang et al. 2022).

Shapes: `(batch, completion_length)` with a 0/1 `mask` of the tokens a completion really has (its EOS
included, padding after it excluded). Each completion is one episode: a per-token KL penalty to the
reference, and the sequence's score added at its last real token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean over the real tokens only."""
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp(min=1)
    return (values * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Zero mean and unit variance over the real tokens; `shift_mean=False` keeps the mean (rewards)."""
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    whitened = (values - mean) * torch.rsqrt(variance + 1e-8)
    return (whitened if shift_mean else whitened + mean) * mask


def token_log_probs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """log p(token) under the logits scaled as when sampling, so that old and new log-probs compare."""
    log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)
    return log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of each completion's last real token (0 for an empty one)."""
    return (mask.sum(dim=1) - 1).clamp(min=0).long()


def per_token_rewards(
    scores: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, kl_coef: float
) -> torch.Tensor:
    """-kl_coef * KL at every token, plus the sequence's score at its last real token."""
    rewards = -kl_coef * kl * mask
    rows = torch.arange(len(scores), device=scores.device)
    rewards[rows, last_token_index(mask)] += scores
    return rewards


def generalized_advantages(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE (Schulman et al. 2016) per episode, ending at its last real token: (advantages, returns)."""
    values = values * mask
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    length = rewards.shape[1]
    for t in reversed(range(length)):
        next_value = values[:, t + 1] if t + 1 < length else torch.zeros_like(running)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = (delta + gamma * lam * running) * mask[:, t]
        advantages[:, t] = running
    return advantages, (advantages + values) * mask


@dataclass(frozen=True)
class Losses:
    """One mini-batch's losses and the diagnostics TRL's PPO logged under the same names."""

    total: torch.Tensor
    policy: torch.Tensor
    value: torch.Tensor
    clip_fraction: torch.Tensor
    value_clip_fraction: torch.Tensor
    approx_kl: torch.Tensor


def ppo_losses(
    *,
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    cliprange: float,
    cliprange_value: float,
    vf_coef: float,
) -> Losses:
    """The clipped surrogate policy loss and the clipped value loss, over the real tokens."""
    ratio = torch.exp(log_probs - old_log_probs)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - cliprange, 1 + cliprange)
    policy = masked_mean(torch.max(unclipped, clipped), mask)
    values_clipped = old_values + (values - old_values).clamp(-cliprange_value, cliprange_value)
    value_errors = torch.max((values - returns) ** 2, (values_clipped - returns) ** 2)
    value = 0.5 * masked_mean(value_errors, mask)
    with torch.no_grad():
        clip_fraction = masked_mean((clipped > unclipped).float(), mask)
        value_clip_fraction = masked_mean(
            ((values_clipped - returns) ** 2 > (values - returns) ** 2).float(), mask
        )
        approx_kl = 0.5 * masked_mean((log_probs - old_log_probs) ** 2, mask)
    return Losses(policy + vf_coef * value, policy, value, clip_fraction, value_clip_fraction, approx_kl)


def adaptive_kl_coef(coef: float, kl: float, target: float, samples: int, horizon: int) -> float:
    """Ziegler et al.'s proportional controller: move the coefficient so the KL per sequence nears target."""
    error = min(max(kl / target - 1, -0.2), 0.2)
    return coef * (1 + error * samples / horizon)
