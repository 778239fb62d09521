"""The steps every trainer-backed runner starts with, each named and called by the runner in order: its data
(`load_data`), its TRL config (`trl_config`), the rows counted at its `max_length` (`count_rows`), its policy
(`load_policy`) and the arguments every TRL trainer takes alike (`trainer_arguments`). None loads a model or
counts rows as a side effect of another.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from align.config.spec import TrainingStage
from align.pipeline.trl_args import config_class, field_types
from align.stages.context import (
    StageContext,
    load_stage_model,
    loaded_rows,
    peft_config,
    stage_config,
    stage_data,
)
from align.stages.prepared import counted_lengths, cut_answers_note, loss_settings, refuse_lost_rows
from align.stages.progress import add_note, note_phase
from align.stages.samples import sample_prompts


@dataclass
class StageData:
    """A stage's rows: train, held out (None: nothing held out), and what a mixture used of each source."""

    train: Any
    evaluation: Any
    mixture: dict[str, float] = field(default_factory=dict)


def load_data(ctx: StageContext) -> StageData:
    """The stage's train and held-out rows (align/stages/context.py `stage_data`); what a mixture leaves
    unused is said on the run's console as it starts, and recorded."""
    logs = ctx.output_dir / "logs"
    note_phase(logs, "loading the data")
    rows = loaded_rows(ctx)
    train, evaluation = stage_data(ctx, rows)
    if (unused := rows.unused_note()) is not None:
        add_note(logs, f"{ctx.plan.where}.data.train: {unused}")
    note_phase(logs, f"preparing {len(train):,} training rows and the model")
    return StageData(train, evaluation, rows.mixture_counts())


def trl_config(
    ctx: StageContext,
    data: StageData,
    tokenizer: Any,
    overrides: dict[str, Any] | None = None,
    *,
    eval_on_start: bool = False,
) -> Any:
    """TRL's config of the stage's kind: the `trl:` block plus the runner's `overrides`. `eval_on_start`: TRL
    evaluates the held-out rows at the start of train(), where every backend can evaluate (DeepSpeed
    ZeRO-1/2 refuses any evaluation before its engine exists)."""
    overrides = {
        **data_processes(ctx, len(data.train)),
        **loss_settings(ctx, tokenizer, data.train),
        **(overrides or {}),
    }
    if eval_on_start:
        overrides = {"eval_on_start": data.evaluation is not None, **overrides}
    return stage_config(ctx, overrides)


def count_rows(ctx: StageContext, train: Any, tokenizer: Any, config: Any) -> dict[str, float]:
    """What `max_length` does to the rows the trainer will prepare (align/data/lengths.py), counted before
    the model loads: a stage whose cut leaves too many of them nothing to learn stops here, and one that
    cuts many answers says so in its progress notes."""
    lengths = counted_lengths(ctx, train, tokenizer, config)
    refuse_lost_rows(ctx.plan, lengths)
    if (note := cut_answers_note(ctx.plan, lengths)) is not None:
        add_note(ctx.output_dir / "logs", note)
    return lengths.metrics() if lengths is not None else {}


def load_policy(ctx: StageContext) -> Any:
    """The policy from `ctx`'s input, loaded as the backend asks (4-bit for QLoRA)."""
    lora = ctx.plan.lora
    return load_stage_model(ctx, quantize_4bit=bool(lora and lora.load_in_4bit))


def trainer_arguments(
    ctx: StageContext, model: Any, config: Any, tokenizer: Any, train: Any, evaluation: Any
) -> dict[str, Any]:
    """The arguments every TRL trainer takes alike, with the stage's callbacks and its peft config (the
    template's tokens train too, in an untied head as well)."""
    return {
        "model": model,
        "args": config,
        "train_dataset": train,
        "eval_dataset": evaluation,
        "processing_class": tokenizer,
        "callbacks": ctx.callbacks(),
        "peft_config": peft_config(ctx.plan, tokenizer, model),
    }


def output_folder(ctx: StageContext) -> str:
    """The folder the stage publishes: `adapter` with LoRA, else `model`."""
    return "adapter" if ctx.plan.lora else "model"


def held_out_prompts(ctx: StageContext, data: StageData) -> list[Any]:
    """The held-out prompts greedily sampled before and after (training rows when none are held out)."""
    rows = data.evaluation if data.evaluation is not None else data.train
    stage = ctx.plan.stage
    return sample_prompts(rows, stage.samples if isinstance(stage, TrainingStage) else 0)


LARGE_DATA_ROWS = 10_000
"""From this many training rows, TRL prepares (tokenizes) them in as many processes as the rank has CPUs,
and in two on a one-CPU rank: the processes read the whole file, so the rank itself does not (its memory
holds what it trains on, align/data/mapped_pages.py). Below it, starting them costs more than they save."""


def data_processes(ctx: StageContext, rows: int) -> dict[str, int]:
    """TRL's `dataset_num_proc` for a large dataset, unless the `trl:` block sets it: the rank's CPUs (its
    worker set torch's threads to them), at least two. Preparing runs once (it is cached), before training."""
    import torch

    cpus = torch.get_num_threads()
    settable = "dataset_num_proc" in field_types(config_class(ctx.plan.kind))  # not GRPO's, nor align's PPO
    if rows < LARGE_DATA_ROWS or not settable or "dataset_num_proc" in ctx.plan.trl:
        return {}
    return {"dataset_num_proc": max(2, cpus)}
