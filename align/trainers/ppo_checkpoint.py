"""What a PPO checkpoint holds beyond the Trainer's own files, and how a resume reads it back.

The Trainer writes optimizer, scheduler, RNG and `trainer_state.json`, and restores them on resume. PPO adds:
- the policy as `save_pretrained` writes it (full weights, or the LoRA adapter with the critic's adapter in
  `value/`) and the critic's head as `value_head.pt`: align's own layout, which the Trainer cannot load into
  a `PolicyAndValue`;
- `ppo_state_rank{R}.pt` per rank: the adaptive KL coefficient, the micro-step count, the generator that
  shuffles micro-batches, the statistics not yet logged, and the rollout being trained on when the
  checkpoint falls inside one (rollouts differ per rank, hence one file each).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

VALUE_HEAD_FILE = "value_head.pt"
PPO_STATE_FILE = "ppo_state_rank{rank}.pt"


def save_value_head(value_head: nn.Module, folder: str) -> None:
    torch.save(value_head.state_dict(), os.path.join(folder, VALUE_HEAD_FILE))


def load_value_head(value_head: nn.Module, folder: str) -> None:
    state = torch.load(os.path.join(folder, VALUE_HEAD_FILE), map_location="cpu", weights_only=True)
    value_head.load_state_dict(state)


def load_full_weights(policy: nn.Module, folder: str) -> None:
    """The policy's weights as `save_pretrained` wrote them, in one file or in shards. A tied weight (the
    output embedding) is not written and comes back with the tensor it shares; any other gap is an error."""
    from safetensors.torch import load_file
    from transformers.trainer_utils import load_sharded_checkpoint
    from transformers.utils import SAFE_WEIGHTS_NAME

    single = os.path.join(folder, SAFE_WEIGHTS_NAME)
    if os.path.isfile(single):
        state = load_file(single, device="cpu")
        result = policy.load_state_dict(state, strict=False)
        loaded = set(state)
    else:
        result = load_sharded_checkpoint(policy, folder, strict=False)
        loaded = set(policy.state_dict()) - set(result.missing_keys)
    params = dict(policy.named_parameters(remove_duplicate=False))
    loaded_params = {id(params[name]) for name in loaded if name in params}
    missing = [name for name in result.missing_keys if id(params.get(name)) not in loaded_params]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"the policy in {folder} does not fit the model: missing {missing[:5]}, "
            f"unexpected {result.unexpected_keys[:5]}"
        )


def load_adapters(policy: Any, folder: str) -> None:
    """Every adapter of a PEFT policy from `folder` (`default`) and its subfolders (`value/`).

    Only the weights are set: PEFT's `load_adapter` would also re-mark which parameters train and freeze the
    critic's adapter (see `lora_layers`)."""
    from peft import set_peft_model_state_dict
    from peft.utils import load_peft_weights

    for name in policy.peft_config:
        source = folder if name == "default" else os.path.join(folder, name)
        weights = load_peft_weights(source, device=str(next(policy.parameters()).device))
        result = set_peft_model_state_dict(policy, weights, adapter_name=name)
        if result.unexpected_keys:
            raise ValueError(
                f"adapter '{name}' in {source} does not fit the model: {result.unexpected_keys[:5]}"
            )


def save_state(folder: str, rank: int, state: dict[str, Any]) -> None:
    os.makedirs(folder, exist_ok=True)
    torch.save(state, os.path.join(folder, PPO_STATE_FILE.format(rank=rank)))


def load_state(folder: str, rank: int, device: torch.device) -> dict[str, Any]:
    path = os.path.join(folder, PPO_STATE_FILE.format(rank=rank))
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{path} is missing: a PPO run resumes only from a checkpoint align's PPO wrote with the same "
            "number of ranks; start the stage again instead"
        )
    return torch.load(path, map_location=device, weights_only=True)
