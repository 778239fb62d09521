"""The one module align's PPO trains: the policy and its critic on a shared trunk, with the LoRA switches
that give the reference (adapters off) and the critic's own adapter without a second base model."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from align.compat.peft import lora_switches
from align.trainers.ppo_math import token_log_probs

VALUE_ADAPTER = "value"


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as `generate` computes them, so log-probs match the sampling."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def causal_logits(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs: Any) -> Any:
    return model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids(attention_mask),
        use_cache=False,
        **kwargs,
    )


def completion_log_probs(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int, temperature: float
) -> torch.Tensor:
    """log p of each completion token (from `prompt_length` on) under `model`, its logits scaled as when
    sampling: what PPO's reference gives, wherever that reference runs."""
    logits = causal_logits(model, input_ids, attention_mask).logits[:, prompt_length - 1 : -1]
    return token_log_probs(logits, input_ids[:, prompt_length:], temperature)


@contextmanager
def lora_layers(model: nn.Module, *, active: str | None = None, disabled: bool = False) -> Iterator[None]:
    """Run the LoRA layers with one adapter (`active`), or with none (`disabled`), for this block.

    PEFT's `set_adapter` and `disable_adapter` also re-mark which parameters are trainable: leaving
    either would freeze the critic's adapter, under a DDP or DeepSpeed wrap that expects its gradients.
    So only the layers' switches are flipped, and put back (align/compat/peft.py)."""
    with lora_switches(model, active=active, disabled=disabled):
        yield


class PolicyAndValue(nn.Module):
    """The policy and its critic as the one module the Trainer trains; `forward` gives logits and values.

    `value_adapter=False`: the critic is a linear head on the policy's last hidden state (one forward).
    `value_adapter=True`: the policy (a PEFT model) carries a second adapter, `value`, and the critic's head
    reads the base run with that adapter instead (a second forward, no second base).
    """

    def __init__(self, policy: nn.Module, value_adapter: bool) -> None:
        super().__init__()
        self.policy = policy
        self.value_adapter = value_adapter
        weight = next(policy.parameters())
        self.value_head = nn.Linear(policy.config.hidden_size, 1, device=weight.device)
        nn.init.zeros_(self.value_head.weight)  # values start at 0: the first advantages are the rewards
        nn.init.zeros_(self.value_head.bias)
        self.config = policy.config
        # a model sharded at load (FSDP2) reduces its own gradients; the Trainer must not wrap it in DDP
        self.is_distributed_loading_by_transformers = getattr(
            policy, "is_distributed_loading_by_transformers", False
        )

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        outputs = causal_logits(
            self.policy, input_ids, attention_mask, output_hidden_states=not self.value_adapter
        )
        if self.value_adapter:
            with lora_layers(self.policy, active=VALUE_ADAPTER):
                hidden = causal_logits(self.policy, input_ids, attention_mask, output_hidden_states=True)
            hidden = hidden.hidden_states[-1]
        else:
            hidden = outputs.hidden_states[-1]
        values = self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1)
        return outputs.logits, values

    def gradient_checkpointing_enable(self, **kwargs: Any) -> None:
        """The Trainer's `gradient_checkpointing: true` reaches the policy (the critic shares its trunk).
        Refused with a critic adapter: the recomputation in backward would run with the policy's adapter."""
        if self.value_adapter:
            raise ValueError("gradient checkpointing gives a critic on its own adapter wrong gradients")
        self.policy.gradient_checkpointing_enable(**kwargs)

    def reference(self) -> Any:
        """The LoRA reference: the same base with every adapter off (no copy)."""
        return lora_layers(self.policy, disabled=True)


def add_value_adapter(policy: nn.Module, lora_config: Any) -> None:
    """A second LoRA adapter for the critic; both adapters stay trainable in the one optimizer."""
    policy.add_adapter(VALUE_ADAPTER, lora_config)
    for name, param in policy.named_parameters():
        if "lora_" in name:
            param.requires_grad_(True)
