"""What the memory plan counts for a stage (align/models/memory.py prices it): its trained and frozen
models, micro-batch and sequence length, and what trains beside the policy."""

from __future__ import annotations

from align.config.spec import KINDS, DistillStage, RewardedStage, StageBase
from align.config.stage_parts import lora_of, trl_of
from align.models.architectures import ALL_LINEAR, Architecture
from align.models.memory import Workload
from align.models.precision import PURE, compute_dtype
from align.pipeline.trl_args import trl_setting
from align.planning.placement import VALUE_ADAPTER, VALUE_NONE, Placement, frozen_models

PROMPT_TOKENS = 512
"""The prompt length the plan assumes for online RL (ppo, grpo, rloo): none of their configs caps a
prompt, so a trained sequence is this plus `max_completion_length`. An assumption, not a limit."""
UPCASTS_4BIT_BASE = ("ppo",)
"""Kinds whose QLoRA base is prepared by peft's `prepare_model_for_kbit_training` (align's PPO,
stages/ppo.py): every weight left out of NF4 is upcast to fp32, about 2.1 GB for Llama-3-8B's embeddings and
head. TRL's trainers leave those weights at the compute dtype."""


def workload(
    stage: StageBase,
    precision: str,
    placement: Placement,
    arch: Architecture,
    reward_params: dict[int, int] | None = None,
    token_rows: int = 0,
    teacher: int = 0,
) -> Workload:
    """What the memory plan counts for a stage; `reward_params` as `reward_model_params` gives them,
    `token_rows` the embedding rows LoRA trains beside its adapters (a chat template's, planning/lora.py),
    and `teacher` a distill stage's teacher's parameters (`teacher_params`).

    A PPO critic trains beside the policy: its head, and under `value: adapter` a second LoRA adapter
    whose forward through the shared trunk is kept for backward too. Rollouts (generation, and the
    no-grad forwards of reference, reward models and critic) are transient and not counted.
    """
    lora, trl = lora_of(stage), trl_of(stage)
    targets = tuple(lora.target_modules) if lora and isinstance(lora.target_modules, list) else ALL_LINEAR
    critic = 0
    if placement.value != VALUE_NONE:
        critic = arch.hidden_size + 1  # the value head, hidden -> 1 with a bias
    if placement.value == VALUE_ADAPTER:
        critic += arch.lora_param_count(lora.r, targets)
    checkpointing = trl.get("activation_checkpointing") or trl_setting(
        stage.kind, trl, "gradient_checkpointing"
    )
    compute = compute_dtype(precision)
    return Workload(
        dtype="bf16" if compute == "fp32" and lora and lora.load_in_4bit else compute,
        pure=precision == PURE,
        lora_rank=lora.r if lora else None,
        lora_targets=targets,
        quantize_4bit=bool(lora and lora.load_in_4bit),
        upcast_unpacked=bool(lora and lora.load_in_4bit and stage.kind in UPCASTS_4BIT_BASE),
        frozen_models=frozen_models(placement, arch.param_count(), compute, reward_params, teacher),
        micro_batch_size=micro_batch(stage),
        seq_len=sequence_length(stage),
        gradient_checkpointing=bool(checkpointing),
        extra_trainable=critic + token_rows * arch.hidden_size,
        trunk_passes=2 if placement.value == VALUE_ADAPTER else 1,
    )


def micro_batch(stage: StageBase) -> int:
    """Sequences per forward of a training stage: a DPO pair is two."""
    batch = trl_setting(stage.kind, stage.trl, "per_device_train_batch_size")
    return int(batch) * KINDS[stage.kind].sequences


def sequence_length(stage: StageBase) -> int:
    """Tokens per trained sequence: `max_length`, or for online RL and distillation a prompt plus its
    completion."""
    if isinstance(stage, RewardedStage | DistillStage):
        return PROMPT_TOKENS + int(trl_setting(stage.kind, stage.trl, "max_completion_length"))
    return int(trl_setting(stage.kind, stage.trl, "max_length") or 1024)
