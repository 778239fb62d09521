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
from align.stages.context import StageContext, load_stage_model, on_training_device, stage_tokenizer
from align.stages.distill_measure import teacher_measure
from align.stages.preamble import (
    count_rows,
    held_out_prompts,
    load_data,
    load_policy,
    output_folder,
    trainer_arguments,
    trl_config,
)
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

CURVES = (("loss", "loss"),)  # the logged loss: its first and last values are recorded


def frozen_teacher(ctx: StageContext, tokenizer: Any) -> Any:
    """The teacher the controller resolved, its earlier adapters merged, loaded as the backend places a
    frozen model, with embeddings that fit the student's tokenizer (validate made sure they share one)."""
    teacher_ctx = ctx.with_model(ctx.inputs.teacher)
    teacher = load_stage_model(teacher_ctx, frozen=True, tokenizer=tokenizer)
    return on_training_device(ctx, teacher.requires_grad_(False).eval())


def run(ctx: StageContext) -> StageResult:
    """Measure the student against the teacher, distil, measure again, and save the student."""
    from trl import DistillationTrainer

    data = load_data(ctx)
    tokenizer = stage_tokenizer(ctx, padding_side="left")  # TRL generates from left-padded prompts
    config = trl_config(ctx, data, tokenizer)
    counts = data.mixture | count_rows(ctx, data.train, tokenizer, config)
    teacher = frozen_teacher(ctx, tokenizer)
    student = load_policy(ctx)
    arguments = trainer_arguments(ctx, student, config, tokenizer, data.train, None)
    trainer = DistillationTrainer(teacher_model=teacher, **arguments)
    measure = teacher_measure(trainer, tokenizer, data.evaluation, ctx.plan.seed)
    prompts, output, model = held_out_prompts(ctx, data), output_folder(ctx), trainer.model

    clocks = start_clocks(ctx, trainer)
    ready(ctx, model, model)
    metrics = measure("before")
    clocks.lap("measure_before")
    before = sampled(clocks, "before", model, tokenizer, prompts)
    checksums = trainable_checksums(model)
    train(ctx, trainer, clocks)
    metrics |= measure("after")
    clocks.lap("measure_after")
    after = sampled(clocks, "after", model, tokenizer, prompts)
    metrics |= {**trained(trainer, model, checksums, clocks), **counts}
    save_output(ctx, trainer, output)
    metrics |= published(ctx, trainer, tokenizer, output, CURVES)
    return finished(clocks, metrics, trainer, output, (prompts, before, after))
