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
    stage_config,
    stage_data,
    stage_tokenizer,
)
from align.stages.samples import sample_prompts
from align.stages.training import Training, suffixed, train_stage


def run(ctx: StageContext) -> StageResult:
    """Score held-out pairs, train, score them again, and save the adapter or model."""
    from trl import DPOTrainer

    lora = ctx.plan.stage.lora
    train, evaluation = stage_data(ctx)
    precompute = ctx.plan.placement.reference == REFERENCE_PRECOMPUTED
    config = stage_config(ctx, {"precompute_ref_log_probs": True} if precompute else None)
    tokenizer = stage_tokenizer(ctx, padding_side="left")
    trainer = DPOTrainer(
        model=load_stage_model(ctx, quantize_4bit=bool(lora and lora.load_in_4bit)),
        ref_model=frozen_reference(ctx),  # None: TRL disables the adapters, or precomputes
        args=config,
        train_dataset=train,
        eval_dataset=evaluation,
        processing_class=tokenizer,
        callbacks=ctx.callbacks(),
        peft_config=peft_config(lora),
    )
    held_out = evaluation if evaluation is not None else train

    def scores(phase: str) -> dict[str, float]:
        return suffixed(
            preference_scores(trainer.model, tokenizer, held_out, config.max_length or 1024), phase
        )

    output = "adapter" if lora else "model"
    training = Training(trainer, tokenizer, output, held_out=scores, sample_prompts=sample_prompts(held_out))
    return train_stage(ctx, training)
