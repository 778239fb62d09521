"""Online RL on prompts with TRL's GRPOTrainer or RLOOTrainer; the two differ only in how they turn a
group's rewards into advantages, so one runner serves both kinds. Rewards and the held-out measurement
are shared with PPO (align/stages/rl.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager

from align.stages.context import (
    ModelInput,
    StageContext,
    StageResult,
    load_stage_model,
    loss_curve,
    peft_config,
    stage_config,
    stage_data,
    stage_tokenizer,
    write_log_history,
)
from align.stages.reward import merged_input
from align.stages.rl import held_out_rewards, held_out_rows, stage_rewards

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
        yield dataclasses.replace(ctx, model_input=ModelInput(folder))


def run(ctx: StageContext) -> StageResult:
    """Measure held-out reward, train with the stage's rewards, measure again, and save the policy."""
    import trl

    stage = ctx.plan.stage
    lora = stage.lora
    train, evaluation = stage_data(stage, ctx.plan.name, "prompts")
    rewards = stage_rewards(ctx)
    config = stage_config(ctx, ctx.plan.kind, {"reward_weights": rewards.weights})
    tokenizer = stage_tokenizer(ctx, padding_side="left")
    with policy_input(ctx, config.beta) as policy_ctx:
        trainer = getattr(trl, TRAINERS[ctx.plan.kind])(
            model=load_stage_model(policy_ctx, quantize_4bit=bool(lora and lora.load_in_4bit)),
            reward_funcs=rewards.sources,
            args=config,
            train_dataset=train,
            processing_class=tokenizer,
            reward_processing_classes=rewards.tokenizers,
            callbacks=ctx.backend.callbacks(ctx.plan, ctx.output_dir / "logs"),
            peft_config=peft_config(lora),
        )
    ctx.backend.verify(trainer.model, ctx.plan)
    held_out = held_out_rows(train, evaluation)
    before = held_out_rewards(trainer.model, tokenizer, held_out, rewards, config, ctx.plan.seed)
    trainer.train(resume_from_checkpoint=config.resume_from_checkpoint)
    after = held_out_rewards(trainer.model, tokenizer, held_out, rewards, config, ctx.plan.seed)
    metrics = {f"{key}_before": value for key, value in before.items()}
    metrics.update({f"{key}_after": value for key, value in after.items()})
    output = "adapter" if lora else "model"
    trainer.save_model(str(ctx.output_dir / output))
    if ctx.is_main:
        tokenizer.save_pretrained(str(ctx.output_dir / output))
        metrics.update(loss_curve(write_log_history(trainer, ctx.output_dir), key="reward"))
    return StageResult(output=output, metrics=metrics)
