"""Supervised fine-tuning with TRL's SFTTrainer, full-parameter or LoRA/QLoRA, padding-free unless the stage
asks otherwise (align/batching.py)."""

from __future__ import annotations

from align.batching import PADDING_FREE, truncated, without_length_limit
from align.stages.context import (
    StageContext,
    StageResult,
    load_stage_model,
    peft_config,
    stage_config,
    stage_data,
    stage_tokenizer,
)
from align.stages.samples import sample_prompts
from align.stages.training import Training, train_stage


def run(ctx: StageContext) -> StageResult:
    """Train, then save the adapter (LoRA) or the whole model, with the eval loss before and after."""
    from trl import SFTTrainer

    lora = ctx.plan.stage.lora
    train, evaluation = stage_data(ctx)
    # the eval loss before training comes from the trainer's start-of-training evaluation, inside train(),
    # where every backend can evaluate (DeepSpeed ZeRO-1/2 refuses any evaluation before its engine exists)
    before = evaluation is not None
    config = stage_config(ctx, {"eval_on_start": before})
    padding_free = ctx.plan.batching is not None and ctx.plan.batching[0] == PADDING_FREE
    limit = without_length_limit(config) if padding_free else (None, "")
    tokenizer = stage_tokenizer(ctx)
    trainer = SFTTrainer(
        model=load_stage_model(ctx, quantize_4bit=bool(lora and lora.load_in_4bit)),
        args=config,
        train_dataset=train,
        eval_dataset=evaluation,
        processing_class=tokenizer,
        callbacks=ctx.callbacks(),
        peft_config=peft_config(lora),
    )
    trainer.train_dataset = truncated(trainer.train_dataset, *limit)
    trainer.eval_dataset = truncated(trainer.eval_dataset, *limit)

    def eval_loss(phase: str) -> dict[str, float]:
        if evaluation is None or phase == "before":
            return {}
        after = {"eval_loss_after": trainer.evaluate()["eval_loss"]}
        if not before:
            return after
        logged = next(entry["eval_loss"] for entry in trainer.state.log_history if "eval_loss" in entry)
        return {"eval_loss_before": logged, **after}

    output = "adapter" if lora else "model"
    prompts = sample_prompts(evaluation if evaluation is not None else train)
    return train_stage(ctx, Training(trainer, tokenizer, output, held_out=eval_loss, sample_prompts=prompts))
