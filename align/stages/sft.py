"""Supervised fine-tuning with TRL's SFTTrainer, full-parameter or LoRA/QLoRA, padding-free unless the stage
asks otherwise (align/data/batching.py)."""

from __future__ import annotations

from typing import Any

from align.data.batching import PADDING_FREE, truncated, without_length_limit
from align.records import StageResult
from align.stages.context import StageContext, stage_tokenizer
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


def run(ctx: StageContext) -> StageResult:
    """Train, then save the adapter (LoRA) or the whole model, with the eval loss before and after."""
    from trl import SFTTrainer

    data = load_data(ctx)
    tokenizer = stage_tokenizer(ctx)
    # the eval loss before training comes from the trainer's start-of-training evaluation
    config = trl_config(ctx, data, tokenizer, eval_on_start=True)
    counts = data.mixture | count_rows(ctx, data.train, tokenizer, config)  # before max_length is lifted
    policy = load_policy(ctx)
    padding_free = ctx.plan.batching is not None and ctx.plan.batching[0] == PADDING_FREE
    limit = without_length_limit(config) if padding_free else (None, "")
    trainer = SFTTrainer(**trainer_arguments(ctx, policy, config, tokenizer, data.train, data.evaluation))
    trainer.train_dataset = truncated(trainer.train_dataset, *limit)
    trainer.eval_dataset = truncated(trainer.eval_dataset, *limit)
    prompts, output, model = held_out_prompts(ctx, data), output_folder(ctx), trainer.model

    clocks = start_clocks(ctx, trainer)
    ready(ctx, model, model)
    clocks.lap("measure_before")  # nothing yet: TRL evaluates at the start of train()
    before = sampled(clocks, "before", model, tokenizer, prompts)
    checksums = trainable_checksums(model)
    train(ctx, trainer, clocks)
    metrics = eval_losses(trainer, data.evaluation)
    clocks.lap("measure_after")
    after = sampled(clocks, "after", model, tokenizer, prompts)
    metrics |= {**trained(trainer, model, checksums, clocks), **counts}
    save_output(ctx, trainer, output)
    metrics |= published(ctx, trainer, tokenizer, output, CURVES)
    return finished(clocks, metrics, trainer, output, (prompts, before, after))


def eval_losses(trainer: Any, evaluation: Any) -> dict[str, float]:
    """The held-out loss after training (an evaluation now), and before it, as TRL logged it at the start
    of train(); nothing when no rows are held out."""
    if evaluation is None:
        return {}
    after = {"eval_loss_after": trainer.evaluate()["eval_loss"]}
    logged = [entry["eval_loss"] for entry in trainer.state.log_history if "eval_loss" in entry]
    return {"eval_loss_before": logged[0], **after}
