"""A reward model with TRL's RewardTrainer: the input model with a one-label sequence-classification head,
trained on preference pairs to score the chosen reply above the rejected one.

The output is always a whole `model/` folder that loads with plain `AutoModelForSequenceClassification`:
LoRA is merged before saving, because the RL stages that read it load a model, not an adapter.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from align.measures.heldout import training_text
from align.models.loading import load_pretrained
from align.records import StageResult
from align.stages.context import StageContext, merged_input
from align.stages.preamble import preamble
from align.stages.training import Training, no_measure, train_stage


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

    lora = ctx.plan.stage.lora
    start = preamble(ctx)
    config, tokenizer = start.config, start.tokenizer
    model = load_reward_model(ctx)
    model.config.pad_token_id = tokenizer.pad_token_id  # the head scores the last non-pad token
    # a sequence-classification task keeps the new score head trainable beside the adapters
    lora_config = dataclasses.replace(start.peft_config(), task_type="SEQ_CLS") if lora else None
    trainer = RewardTrainer(**{**start.trainer_kwargs(model), "peft_config": lora_config})
    held_out = start.evaluation

    def accuracy(phase: str) -> dict[str, float]:
        value = pairwise_accuracy(trainer.model, tokenizer, held_out, config.max_length or 1024)
        return {f"pairwise_accuracy_{phase}": value}

    def save(folder: Path) -> None:
        """A whole model folder; LoRA adapters (and their trained score head) are merged into it first."""
        if lora is None:
            trainer.save_model(str(folder))
        elif ctx.is_main:
            trainer.accelerator.unwrap_model(trainer.model).merge_and_unload().save_pretrained(str(folder))

    measure = accuracy if held_out is not None else no_measure
    return train_stage(
        ctx, Training(trainer, tokenizer, "model", held_out=measure, save=save, counts=start.counts)
    )
