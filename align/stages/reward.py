"""A reward model with TRL's RewardTrainer: the input model with a one-label sequence-classification head,
trained on preference pairs to score the chosen reply above the rejected one.

The output is always a whole `model/` folder that loads with plain `AutoModelForSequenceClassification`:
LoRA is merged before saving, because the RL stages that read it load a model, not an adapter.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from align.measures.heldout import training_text
from align.models.loading import load_pretrained
from align.records import StageResult
from align.stages.context import StageContext, merged_input, peft_config, stage_tokenizer
from align.stages.preamble import count_rows, load_data, trainer_arguments, trl_config
from align.stages.training import (
    finished,
    published,
    ready,
    sampled,
    start_clocks,
    train,
    trainable_checksums,
    trained,
)

OUTPUT = "model"  # always a whole model: the RL stages that read it load a model, not an adapter
CURVES = (("loss", "loss"),)  # the logged loss: its first and last values are recorded


def load_reward_model(ctx: StageContext) -> torch.nn.Module:
    """The input model with a fresh one-label score head, loaded the way the backend asks."""
    from transformers import AutoModelForSequenceClassification, set_seed

    set_seed(ctx.plan.seed)  # the score head is random: the same seed gives the same head
    with merged_input(ctx) as folder:
        model = load_pretrained(
            AutoModelForSequenceClassification,
            folder,
            num_labels=1,
            trust_remote_code=ctx.plan.remote_code,
            **{"dtype": ctx.load_dtype, **ctx.backend.model_kwargs(ctx.plan)},
        )
    return ctx.backend.prepare(model, ctx.plan)


def pair_texts(row: dict[str, Any], tokenizer: Any) -> tuple[str, str]:
    """Chosen and rejected as the text RewardTrainer scores: chat-formatted, or prompt + reply + eos."""
    return tuple(training_text(tokenizer, row.get("prompt"), row[key]) for key in ("chosen", "rejected"))


@torch.no_grad()
def pairwise_accuracy(model: Any, tokenizer: Any, rows: Any, max_length: int) -> float:
    """Share of held-out pairs whose chosen reply scores above the rejected one (0.5 is chance)."""
    was_training = model.training
    model.eval()
    wins = 0
    for row in rows:
        batch = tokenizer(
            list(pair_texts(row, tokenizer)),
            return_tensors="pt",
            padding=True,
            truncation=True,
            max_length=max_length,
            add_special_tokens=False,
        ).to(model.device)
        chosen, rejected = model(**batch).logits[:, 0].float().tolist()
        wins += chosen > rejected
    model.train(was_training)
    return wins / len(rows)


def run(ctx: StageContext) -> StageResult:
    """Score held-out pairs, train, score them again, and save `model/` with its tokenizer."""
    from trl import RewardTrainer

    lora = ctx.plan.lora
    data = load_data(ctx)
    tokenizer = stage_tokenizer(ctx)
    config = trl_config(ctx, data, tokenizer)
    counts = data.mixture | count_rows(ctx, data.train, tokenizer, config)
    scorer = load_reward_model(ctx)
    scorer.config.pad_token_id = tokenizer.pad_token_id  # the head scores the last non-pad token
    # a sequence-classification task keeps the new score head trainable beside the adapters
    lora_config = dataclasses.replace(peft_config(ctx.plan), task_type="SEQ_CLS") if lora else None
    arguments = trainer_arguments(ctx, scorer, config, tokenizer, data.train, data.evaluation)
    trainer = RewardTrainer(**{**arguments, "peft_config": lora_config})
    max_length = config.max_length or 1024
    prompts: list[Any] = []  # a reward model scores replies: it writes none
    model = trainer.model

    clocks = start_clocks(ctx, trainer)
    ready(ctx, model, model)
    metrics = held_out_accuracy(trainer.model, tokenizer, data.evaluation, max_length, "before")
    clocks.lap("measure_before")
    before = sampled(clocks, "before", model, tokenizer, prompts)
    checksums = trainable_checksums(model)
    train(ctx, trainer, clocks)
    metrics |= held_out_accuracy(trainer.model, tokenizer, data.evaluation, max_length, "after")
    clocks.lap("measure_after")
    after = sampled(clocks, "after", model, tokenizer, prompts)
    metrics |= {**trained(trainer, model, checksums, clocks), **counts}
    save_whole_model(ctx, trainer, merge=lora is not None)
    metrics |= published(ctx, trainer, tokenizer, OUTPUT, CURVES)
    return finished(clocks, metrics, trainer, OUTPUT, (prompts, before, after))


def held_out_accuracy(model: Any, tokenizer: Any, rows: Any, max_length: int, phase: str) -> dict[str, float]:
    """`pairwise_accuracy_<phase>` on the held-out pairs; nothing when none are held out."""
    if rows is None:
        return {}
    return {f"pairwise_accuracy_{phase}": pairwise_accuracy(model, tokenizer, rows, max_length)}


def save_whole_model(ctx: StageContext, trainer: Any, merge: bool) -> None:
    """A whole model folder; LoRA adapters (and their trained score head) are merged into it first."""
    folder = ctx.output_dir / OUTPUT
    if not merge:
        trainer.save_model(str(folder))
    elif ctx.is_main:
        trainer.accelerator.unwrap_model(trainer.model).merge_and_unload().save_pretrained(str(folder))
