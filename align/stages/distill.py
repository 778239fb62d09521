"""On-policy distillation with TRL's DistillationTrainer: the stage's model (the student) samples completions
of its prompts and is trained towards the teacher's next-token distribution on them, by the generalized
Jensen-Shannon divergence at `trl.beta` (0: forward KL, 1: reverse KL).

The teacher is frozen and placed as the plan says: loaded like a reference copy, in the compute dtype,
sharded under fsdp (transformers' FSDP2 at load) and whole on every rank otherwise; TRL prepares it beside
the student. Before and after training the student is measured against it on the held-out prompts
(align/stages/distill_measure.py).
"""

from __future__ import annotations

from typing import Any

from align.records import StageResult
from align.stages.context import StageContext, load_stage_model, on_training_device
from align.stages.distill_measure import teacher_measure
from align.stages.preamble import preamble
from align.stages.training import Training, train_stage


def frozen_teacher(ctx: StageContext, tokenizer: Any) -> Any:
    """The teacher the controller resolved, its earlier adapters merged, loaded as the backend places a
    frozen model, with embeddings that fit the student's tokenizer (validate made sure they share one)."""
    teacher_ctx = ctx.with_model(ctx.inputs.teacher)
    teacher = load_stage_model(teacher_ctx, frozen=True, tokenizer=tokenizer)
    return on_training_device(ctx, teacher.requires_grad_(False).eval())


def run(ctx: StageContext) -> StageResult:
    """Measure the student against the teacher, distil, measure again, and save the student."""
    from trl import DistillationTrainer

    start = preamble(ctx, padding_side="left")  # TRL generates from left-padded prompts
    tokenizer = start.tokenizer
    teacher = frozen_teacher(ctx, tokenizer)
    trainer = DistillationTrainer(teacher_model=teacher, **{**start.trainer_kwargs(), "eval_dataset": None})
    measure = teacher_measure(trainer, tokenizer, start.evaluation, ctx.plan.seed)
    training = Training(
        trainer,
        tokenizer,
        start.output,
        held_out=measure,
        sample_prompts=start.sample_prompts(),
        counts=start.counts,
    )
    return train_stage(ctx, training)
