"""PPO with a critic, on align's own trainer (align/trainers/ppo.py): the policy, its reference, the
stage's rewards and the critic, each placed as the plan says.

- reference: with LoRA the policy's base with its adapters disabled; else a frozen copy the backend places
  (replicated, or sharded under fsdp), or one in a Ray actor of its own (`reference: {placement: actor}`);
- reward models: frozen, loaded the way the backend places the policy, or each in a Ray actor of its own
  (`placement: actor`, the ranks wait on it: `time_service_wait_s`); rule functions run on each rank;
- critic: `value: head` puts a value head on the policy's trunk, `value: adapter` gives it its own LoRA
  adapter on the same base (and a head).
Before and after training the policy samples held-out prompts with a fixed seed and the same rewards score
them; the stage's metrics carry those means, and the first and last logged reward and KL.
"""

from __future__ import annotations

from typing import Any

import torch

from align.planning.placement import VALUE_ADAPTER
from align.records import StageResult
from align.stages.context import StageContext, on_training_device, peft_config, stage_tokenizer
from align.stages.preamble import held_out_prompts, load_data, load_policy, output_folder, trl_config
from align.stages.rl import HeldOutRewards, Rewards, signal_watch, stage_rewards
from align.stages.services import Waited, ppo_reference, remote_rewards
from align.stages.training import (
    finished,
    published,
    ready,
    sampled,
    save_output,
    start_clocks,
    train,
    trainable_checksums,
    trained,
)
from align.trainers.policy_value import PolicyAndValue, add_value_adapter
from align.trainers.ppo import PPOTrainer, RewardFn

CURVES = (("reward", "reward"), ("objective/kl", "kl"))
"""The logged reward and KL whose first and last values are recorded."""


def policy_model(ctx: StageContext) -> Any:
    """The input model, with the stage's LoRA adapter (and the critic's, for `value: adapter`)."""
    lora = ctx.plan.lora
    model = load_policy(ctx)
    if lora is None:
        return model
    from peft import get_peft_model, prepare_model_for_kbit_training

    if lora.load_in_4bit:
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    model = get_peft_model(model, peft_config(ctx.plan))
    if ctx.plan.placement.value == VALUE_ADAPTER:
        add_value_adapter(model, peft_config(ctx.plan))
    return model


def reward_function(rewards: Rewards) -> RewardFn:
    """The trainer's view of the stage's rewards: the weighted score and each reward's values."""

    def score(prompts: list[Any], completions: list[Any], columns: dict[str, list[Any]]):
        values = rewards.score(prompts, completions, columns)
        return rewards.total(values), values

    return score


def run(ctx: StageContext) -> StageResult:
    """Measure held-out reward, train with PPO, measure again, and save the policy (and its critic)."""
    data = load_data(ctx)
    tokenizer = stage_tokenizer(ctx, padding_side="left")
    config = trl_config(ctx, data, tokenizer)
    waited = Waited()
    rewards = stage_rewards(ctx, remote_rewards(ctx, waited))
    for source in rewards.sources:  # align's own trainer: nobody else moves its reward models
        if isinstance(source, torch.nn.Module):
            on_training_device(ctx, source)
    policy = policy_model(ctx)
    # policy, critic adapter and value head: the skeleton checks that each trainable parameter moved
    model = PolicyAndValue(policy, value_adapter=ctx.plan.placement.value == VALUE_ADAPTER)
    trainer = PPOTrainer(
        model=model,
        ref_model=ppo_reference(ctx, waited),
        rewards=reward_function(rewards),
        args=config,
        train_dataset=data.train,
        processing_class=tokenizer,
        callbacks=ctx.callbacks(),
    )
    watch = signal_watch(ctx, config, tokenizer, lambda: rewards.latest, unit="rollouts")
    trainer.add_callback(watch)
    seed, paused = ctx.plan.seed, waited.paused
    held_out = HeldOutRewards(data.evaluation, rewards, config, tokenizer, seed, paused, watch)
    prompts, output = held_out_prompts(ctx, data), output_folder(ctx)

    clocks = start_clocks(ctx, trainer)
    ready(ctx, model, policy)
    metrics = held_out.measure(policy, "before")
    clocks.lap("measure_before")
    before = sampled(clocks, "before", policy, tokenizer, prompts)
    checksums = trainable_checksums(model)
    train(ctx, trainer, clocks)
    metrics |= held_out.measure(policy, "after")
    clocks.lap("measure_after")
    after = sampled(clocks, "after", policy, tokenizer, prompts)
    metrics |= trained(trainer, model, checksums, clocks)
    metrics |= {**trainer.time_split(), **waited.split(), **watch.metrics()}
    save_output(ctx, trainer, output)
    metrics |= published(ctx, trainer, tokenizer, output, CURVES)
    return finished(clocks, metrics, trainer, output, (prompts, before, after))
