"""What every trainer-backed runner starts from: its data, TRL config, tokenizer, model and peft config.

Each runner used to open with the same block; it asks for a `Preamble` instead and keeps only what is its
own (the trainer class, its extra arguments, what it measures).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from align.pipeline.trl_args import config_class, field_types
from align.stages.context import (
    StageContext,
    load_stage_model,
    loaded_rows,
    peft_config,
    stage_config,
    stage_data,
    stage_tokenizer,
)
from align.stages.prepared import counted_lengths, cut_answers_note, loss_settings, refuse_lost_rows
from align.stages.progress import add_note, note_phase
from align.stages.samples import sample_prompts


@dataclass
class Preamble:
    ctx: StageContext
    train: Any
    evaluation: Any  # None: nothing held out
    config: Any  # TRL's config class of the stage's kind
    tokenizer: Any
    counts: dict[str, float] = field(default_factory=dict)
    """What a mixture used of each source, and what `max_length` does to the rows (align/data/lengths.py),
    once `trainer_kwargs` counted them."""

    @property
    def output(self) -> str:
        """The folder the stage publishes: `adapter` with LoRA, else `model`."""
        return "adapter" if self.ctx.plan.stage.lora else "model"

    def sample_prompts(self) -> list[Any]:
        """The held-out prompts greedily sampled before and after (training rows when none are held out)."""
        rows = self.evaluation if self.evaluation is not None else self.train
        return sample_prompts(rows, self.ctx.plan.stage.samples)

    def load_model(self, ctx: StageContext | None = None) -> Any:
        """The policy, loaded as the backend asks (4-bit for QLoRA), from `ctx`'s input (default: the
        stage's own)."""
        lora = self.ctx.plan.stage.lora
        return load_stage_model(ctx or self.ctx, quantize_4bit=bool(lora and lora.load_in_4bit))

    def peft_config(self) -> Any:
        return peft_config(self.ctx.plan)

    def trainer_kwargs(self, model: Any = None, train: Any = None) -> dict[str, Any]:
        """The arguments every TRL trainer takes alike; `model` defaults to `load_model()`, `train` (the
        rows as the trainer takes them) to the stage's. The rows are counted first, before the model loads:
        a stage whose cut leaves too many of them nothing to learn stops here."""
        train = self.train if train is None else train
        lengths = counted_lengths(self.ctx, train, self.tokenizer, self.config)
        refuse_lost_rows(self.ctx.plan, lengths)
        if (note := cut_answers_note(self.ctx.plan, lengths)) is not None:
            add_note(self.ctx.output_dir / "logs", note)
        self.counts |= lengths.metrics() if lengths is not None else {}
        model = self.load_model() if model is None else model
        return {
            "model": model,
            "args": self.config,
            "train_dataset": train,
            "eval_dataset": self.evaluation,
            "processing_class": self.tokenizer,
            "callbacks": self.ctx.callbacks(),
            # the template's tokens train too, in an untied head as well
            "peft_config": peft_config(self.ctx.plan, self.tokenizer, model),
        }


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
    if rows < LARGE_DATA_ROWS or not settable or "dataset_num_proc" in ctx.plan.stage.trl:
        return {}
    return {"dataset_num_proc": max(2, cpus)}


def preamble(
    ctx: StageContext,
    overrides: dict[str, Any] | None = None,
    *,
    padding_side: str = "right",
    eval_on_start: bool = False,
) -> Preamble:
    """Data, TRL config (the `trl:` block plus the runner's `overrides`) and tokenizer; the model loads when
    the trainer is built. `eval_on_start`: TRL evaluates the held-out rows at the start of train(), where
    every backend can evaluate (DeepSpeed ZeRO-1/2 refuses any evaluation before its engine exists)."""
    logs = ctx.output_dir / "logs"
    note_phase(logs, "loading the data")
    rows = loaded_rows(ctx)
    train, evaluation = stage_data(ctx, rows)
    if (unused := rows.unused_note()) is not None:  # said on the run's console as it starts, and recorded
        add_note(logs, f"{ctx.plan.where}.data.train: {unused}")
    note_phase(logs, f"preparing {len(train):,} training rows and the model")
    tokenizer = stage_tokenizer(ctx, padding_side=padding_side)
    overrides = {
        **data_processes(ctx, len(train)),
        **loss_settings(ctx, tokenizer, train),
        **(overrides or {}),
    }
    if eval_on_start:
        overrides = {"eval_on_start": evaluation is not None, **overrides}
    config = stage_config(ctx, overrides)
    return Preamble(ctx, train, evaluation, config, tokenizer, rows.mixture_counts())
