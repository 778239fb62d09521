"""PPO with a critic, on align's own trainer (align/trainers/ppo.py): the policy, its reference, the
stage's rewards and the critic, each placed as the plan says.

- reference: with LoRA the policy's base with its adapters disabled; else a frozen copy the backend places
  (replicated, or sharded under fsdp);
- reward models: frozen, loaded the way the backend places the policy; rule functions run on each rank;
- critic: `value: head` puts a value head on the policy's trunk, `value: adapter` gives it its own LoRA
  adapter on the same base (and a head).
Before and after training the policy samples held-out prompts with a fixed seed and the same rewards score
them; the stage's metrics carry those means, and the first and last logged reward and KL.
"""

from __future__ import annotations

from typing import Any

import torch

from align.placement import VALUE_ADAPTER
from align.stages.context import (
    StageContext,
    StageResult,
    frozen_reference,
    load_stage_model,
    on_training_device,
    peft_config,
    stage_config,
    stage_data,
    stage_tokenizer,
)
from align.stages.rl import Rewards, held_out_rewards, stage_rewards
from align.stages.samples import sample_prompts
from align.stages.training import Training, no_measure, suffixed, train_stage
from align.trainers.policy_value import PolicyAndValue, add_value_adapter
from align.trainers.ppo import PPOTrainer, RewardFn


def policy_model(ctx: StageContext) -> Any:
    """The input model, with the stage's LoRA adapter (and the critic's, for `value: adapter`)."""
    lora = ctx.plan.stage.lora
    model = load_stage_model(ctx, quantize_4bit=bool(lora and lora.load_in_4bit))
    if lora is None:
        return model
    from peft import get_peft_model, prepare_model_for_kbit_training

    if lora.load_in_4bit:
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    model = get_peft_model(model, peft_config(lora))
    if ctx.plan.placement.value == VALUE_ADAPTER:
        add_value_adapter(model, peft_config(lora))
    return model


def reward_function(rewards: Rewards) -> RewardFn:
    """The trainer's view of the stage's rewards: the weighted score and each reward's values."""

    def score(prompts: list[Any], completions: list[Any], columns: dict[str, list[Any]]):
        values = rewards.score(prompts, completions, columns)
        return rewards.total(values), values

    return score


def run(ctx: StageContext) -> StageResult:
    """Measure held-out reward, train with PPO, measure again, and save the policy (and its critic)."""
    train, evaluation = stage_data(ctx)
    rewards = stage_rewards(ctx)
    for source in rewards.sources:  # align's own trainer: nobody else moves its reward models
        if isinstance(source, torch.nn.Module):
            on_training_device(ctx, source)
    config = stage_config(ctx)
    tokenizer = stage_tokenizer(ctx, padding_side="left")
    policy = policy_model(ctx)
    # policy, critic adapter and value head: the skeleton checks that each trainable parameter moved
    model = PolicyAndValue(policy, value_adapter=ctx.plan.placement.value == VALUE_ADAPTER)
    trainer = PPOTrainer(
        model=model,
        ref_model=frozen_reference(ctx),
        rewards=reward_function(rewards),
        args=config,
        train_dataset=train,
        processing_class=tokenizer,
        callbacks=ctx.callbacks(),
    )
    held_out = evaluation

    def mean_rewards(phase: str) -> dict[str, float]:
        return suffixed(held_out_rewards(policy, tokenizer, held_out, rewards, config, ctx.plan.seed), phase)

    output = "adapter" if ctx.plan.stage.lora else "model"
    curves = (("reward", "reward"), ("objective/kl", "kl"))
    measure = mean_rewards if held_out is not None else no_measure
    prompts = sample_prompts(held_out if held_out is not None else train)
    training = Training(
        trainer,
        tokenizer,
        output,
        measure,
        curves,
        model=model,
        sample_prompts=prompts,
        sampler=policy,
        run_metrics=trainer.time_split,
    )
    return train_stage(ctx, training)
