"""Direct preference optimisation with TRL's DPOTrainer.

The reference model follows the plan's placement: with LoRA it is the policy's base with the
adapters disabled (TRL does this when `ref_model` is None and the model carries adapters); for
full parameters it is a frozen copy loaded from the input model's folder, or, when the plan finds
that the copy does not fit, log-probs precomputed from the policy before it trains.
"""

from __future__ import annotations

from align.evaluation import preference_scores
from align.placement import REFERENCE_PRECOMPUTED
from align.stages.context import (
    StageContext,
    StageResult,
    frozen_reference,
    load_stage_model,
    peft_config,
    save_outputs,
    stage_config,
    stage_data,
    stage_tokenizer,
)


def run(ctx: StageContext) -> StageResult:
    """Score held-out pairs, train, score them again, and save the adapter or model."""
    from trl import DPOTrainer

    stage = ctx.plan.stage
    lora = stage.lora
    train, evaluation = stage_data(stage, ctx.plan.name, "dpo")
    precompute = ctx.plan.placement.reference == REFERENCE_PRECOMPUTED
    config = stage_config(ctx, "dpo", {"precompute_ref_log_probs": True} if precompute else None)
    tokenizer = stage_tokenizer(ctx, padding_side="left")
    model = load_stage_model(ctx, quantize_4bit=bool(lora and lora.load_in_4bit))
    trainer = DPOTrainer(
        model=model,
        ref_model=frozen_reference(ctx),  # None: TRL disables the adapters, or precomputes
        args=config,
        train_dataset=train,
        eval_dataset=evaluation,
        processing_class=tokenizer,
        callbacks=ctx.backend.callbacks(ctx.plan, ctx.output_dir / "logs"),
        peft_config=peft_config(lora),
    )
    ctx.backend.verify(trainer.model, ctx.plan)
    metrics = {}
    held_out = evaluation if evaluation is not None else train
    max_length = config.max_length or 1024
    # every rank scores: a sharded model's forward pass is a collective
    before = preference_scores(trainer.model, tokenizer, held_out, max_length)
    metrics.update({f"{key}_before": value for key, value in before.items()})
    trainer.train(resume_from_checkpoint=config.resume_from_checkpoint)
    after = preference_scores(trainer.model, tokenizer, held_out, max_length)
    metrics.update({f"{key}_after": value for key, value in after.items()})
    output = "adapter" if lora else "model"
    metrics.update(save_outputs(ctx, trainer, tokenizer, output))
    return StageResult(output=output, metrics=metrics)
