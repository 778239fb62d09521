"""Online RL on prompts with TRL's GRPOTrainer or RLOOTrainer; the two differ only in how they turn a
group's rewards into advantages, so one runner serves both kinds. Rewards and the held-out measurement
are shared with PPO (align/stages/rl.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from align.plan import ModelInput
from align.stages.context import (
    StageContext,
    StageResult,
    load_stage_model,
    merged_input,
    peft_config,
    stage_config,
    stage_data,
    stage_tokenizer,
)
from align.stages.rl import held_out_rewards, stage_rewards
from align.stages.rollout_clock import RolloutClock
from align.stages.samples import sample_prompts
from align.stages.training import Training, no_measure, suffixed, train_stage

TRAINERS = {"grpo": "GRPOTrainer", "rloo": "RLOOTrainer"}


@contextmanager
def policy_input(ctx: StageContext, beta: float) -> Iterator[StageContext]:
    """Where the policy loads from. With a KL term and full parameters, TRL re-loads the reference from
    the policy's folder, so earlier adapters are merged into one first; otherwise they merge in memory,
    and a saved adapter names a base that outlives this stage."""
    if beta == 0 or ctx.plan.stage.lora is not None or not ctx.model_input.adapters:
        yield ctx
        return
    with merged_input(ctx) as folder:
        yield ctx.with_model(ModelInput(folder))


def run(ctx: StageContext) -> StageResult:
    """Measure held-out reward, train with the stage's rewards, measure again, and save the policy."""
    import trl

    lora = ctx.plan.stage.lora
    train, evaluation = stage_data(ctx)
    rewards = stage_rewards(ctx)
    config = stage_config(ctx, {"reward_weights": rewards.weights})
    tokenizer = stage_tokenizer(ctx, padding_side="left")
    with policy_input(ctx, config.beta) as policy_ctx:
        trainer = getattr(trl, TRAINERS[ctx.plan.kind])(
            model=load_stage_model(policy_ctx, quantize_4bit=bool(lora and lora.load_in_4bit)),
            reward_funcs=rewards.sources,
            args=config,
            train_dataset=train,
            processing_class=tokenizer,
            reward_processing_classes=rewards.tokenizers,
            callbacks=ctx.callbacks(),
            peft_config=peft_config(lora),
        )
    held_out = evaluation
    clock = RolloutClock(trainer)

    def mean_rewards(phase: str) -> dict[str, float]:
        return suffixed(
            held_out_rewards(trainer.model, tokenizer, held_out, rewards, config, ctx.plan.seed), phase
        )

    output = "adapter" if lora else "model"
    measure = mean_rewards if held_out is not None else no_measure
    training = Training(
        trainer,
        tokenizer,
        output,
        held_out=measure,
        curves=(("reward", "reward"),),
        sample_prompts=sample_prompts(held_out if held_out is not None else train),
        run_metrics=clock.split,
    )
    return train_stage(ctx, training)
