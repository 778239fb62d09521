"""Supervised fine-tuning with TRL's SFTTrainer, full-parameter or LoRA/QLoRA, padding-free unless the stage
asks otherwise (align/data/batching.py)."""

from __future__ import annotations

from align.data.batching import PADDING_FREE, truncated, without_length_limit
from align.records import StageResult
from align.stages.context import StageContext
from align.stages.preamble import preamble
from align.stages.training import Training, train_stage


def run(ctx: StageContext) -> StageResult:
    """Train, then save the adapter (LoRA) or the whole model, with the eval loss before and after."""
    from trl import SFTTrainer

    # the eval loss before training comes from the trainer's start-of-training evaluation
    start = preamble(ctx, eval_on_start=True)
    evaluation = start.evaluation
    before = evaluation is not None
    padding_free = ctx.plan.batching is not None and ctx.plan.batching[0] == PADDING_FREE
    kwargs = start.trainer_kwargs()  # counts the rows at the stage's max_length, before it is lifted
    limit = without_length_limit(start.config) if padding_free else (None, "")
    trainer = SFTTrainer(**kwargs)
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

    training = Training(
        trainer,
        start.tokenizer,
        start.output,
        held_out=eval_loss,
        sample_prompts=start.sample_prompts(),
        counts=start.counts,
    )
    return train_stage(ctx, training)
