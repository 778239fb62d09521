"""Supervised fine-tuning with TRL's SFTTrainer, full-parameter or LoRA/QLoRA."""

from __future__ import annotations

from align.stages.context import (
    StageContext,
    StageResult,
    load_stage_model,
    peft_config,
    save_outputs,
    stage_config,
    stage_data,
    stage_tokenizer,
)


def run(ctx: StageContext) -> StageResult:
    """Train, then save the adapter (LoRA) or the whole model, with the tokenizer beside it."""
    from trl import SFTTrainer

    stage = ctx.plan.stage
    lora = stage.lora
    train, evaluation = stage_data(stage, ctx.plan.name, "sft")
    # evaluating before training goes through the trainer's own start-of-training hook: a bare
    # evaluate() before train() is refused by DeepSpeed ZeRO-1/2 (no engine yet)
    config = stage_config(ctx, "sft", {"eval_on_start": evaluation is not None})
    tokenizer = stage_tokenizer(ctx)
    model = load_stage_model(ctx, quantize_4bit=bool(lora and lora.load_in_4bit))
    trainer = SFTTrainer(
        model=model,
        args=config,
        train_dataset=train,
        eval_dataset=evaluation,
        processing_class=tokenizer,
        callbacks=ctx.backend.callbacks(ctx.plan, ctx.output_dir / "logs"),
        peft_config=peft_config(lora),
    )
    ctx.backend.verify(trainer.model, ctx.plan)
    metrics = {}
    trainer.train(resume_from_checkpoint=config.resume_from_checkpoint)
    if evaluation is not None:
        metrics["eval_loss_before"] = next(
            e["eval_loss"] for e in trainer.state.log_history if "eval_loss" in e
        )
        metrics["eval_loss_after"] = trainer.evaluate()["eval_loss"]
    output = "adapter" if lora else "model"
    metrics.update(save_outputs(ctx, trainer, tokenizer, output))
    return StageResult(output=output, metrics=metrics)
