"""A reward model with TRL's RewardTrainer: the input model with a one-label sequence-classification head,
trained on preference pairs to score the chosen reply above the rejected one.

The output is always a whole `model/` folder that loads with plain `AutoModelForSequenceClassification`:
LoRA is merged before saving, because the RL stages that read it load a model, not an adapter.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from align.evaluation import as_messages
from align.models import load_causal_lm
from align.stages.context import (
    StageContext,
    StageResult,
    loss_curve,
    peft_config,
    stage_data,
    stage_tokenizer,
    write_log_history,
)
from align.trl_args import build_config


@contextmanager
def merged_input(ctx: StageContext) -> Iterator[str]:
    """The input model as one folder: its base, or (with adapters) the merged model in a scratch folder.

    Loading by folder lets a head other than causal-LM be put on it, and lets TRL re-load a reference
    copy from `config._name_or_path`, which would otherwise name the base without the adapters.
    Each rank writes its own copy: no rank waits on another's disk.
    """
    if not ctx.model_input.adapters:
        yield ctx.model_input.base
        return
    from peft import PeftModel

    model = load_causal_lm(ctx.model_input.base, dtype=ctx.dtype)
    for adapter in ctx.model_input.adapters:
        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    with tempfile.TemporaryDirectory(prefix=".merged-input-", dir=ctx.output_dir) as folder:
        model.save_pretrained(folder)
        del model
        yield folder


def load_reward_model(ctx: StageContext) -> torch.nn.Module:
    """The input model with a fresh one-label score head, loaded the way the backend asks."""
    from transformers import AutoModelForSequenceClassification, set_seed

    set_seed(ctx.plan.seed)  # the score head is random: the same seed gives the same head
    with merged_input(ctx) as folder:
        model = AutoModelForSequenceClassification.from_pretrained(
            folder, num_labels=1, **{"dtype": ctx.dtype, **ctx.backend.model_kwargs(ctx.plan)}
        )
    return ctx.backend.prepare(model, ctx.plan)


def pair_texts(row: dict[str, Any], tokenizer: Any) -> tuple[str, str]:
    """Chosen and rejected as the text RewardTrainer scores: chat-formatted, or prompt + reply + eos."""
    if isinstance(row["chosen"], list):
        prompt = as_messages(row.get("prompt", []), "user")
        return tuple(
            tokenizer.apply_chat_template(prompt + row[key], tokenize=False) for key in ("chosen", "rejected")
        )
    prompt = row.get("prompt", "")
    return tuple(prompt + row[key] + tokenizer.eos_token for key in ("chosen", "rejected"))


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


def save_reward_model(trainer: Any, ctx: StageContext, folder: Path, merge: bool) -> None:
    """A whole model folder; LoRA adapters (and their trained score head) are merged into it first."""
    if not merge:
        trainer.save_model(str(folder))
    elif ctx.is_main:
        trainer.accelerator.unwrap_model(trainer.model).merge_and_unload().save_pretrained(str(folder))


def run(ctx: StageContext) -> StageResult:
    """Score held-out pairs, train, score them again, and save `model/` with its tokenizer."""
    from trl import RewardTrainer

    stage = ctx.plan.stage
    lora = stage.lora
    train, evaluation = stage_data(stage, ctx.plan.name, "reward")
    config = build_config(
        "reward",
        stage.trl,
        output_dir=str(ctx.output_dir / "checkpoints"),
        precision=ctx.plan.precision,
        seed=ctx.plan.seed,
        **ctx.backend.trainer_args(ctx.plan),
    )
    tokenizer = stage_tokenizer(ctx)
    model = load_reward_model(ctx)
    model.config.pad_token_id = tokenizer.pad_token_id  # the head scores the last non-pad token
    # a sequence-classification task keeps the new score head trainable beside the adapters
    lora_config = dataclasses.replace(peft_config(lora), task_type="SEQ_CLS") if lora else None
    trainer = RewardTrainer(
        model=model,
        args=config,
        train_dataset=train,
        eval_dataset=evaluation,
        processing_class=tokenizer,
        callbacks=ctx.backend.callbacks(ctx.plan, ctx.output_dir / "logs"),
        peft_config=lora_config,
    )
    ctx.backend.verify(trainer.model, ctx.plan)
    held_out = evaluation if evaluation is not None else train
    max_length = config.max_length or 1024
    # every rank scores: a sharded model's forward pass is a collective
    metrics = {"pairwise_accuracy_before": pairwise_accuracy(trainer.model, tokenizer, held_out, max_length)}
    trainer.train(resume_from_checkpoint=config.resume_from_checkpoint)
    metrics["pairwise_accuracy_after"] = pairwise_accuracy(trainer.model, tokenizer, held_out, max_length)
    save_reward_model(trainer, ctx, ctx.output_dir / "model", merge=lora is not None)
    if ctx.is_main:
        tokenizer.save_pretrained(str(ctx.output_dir / "model"))
        metrics.update(loss_curve(write_log_history(trainer, ctx.output_dir)))
    return StageResult(output="model", metrics=metrics)
