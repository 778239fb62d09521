"""Online RL on prompts with TRL's GRPOTrainer or RLOOTrainer; the two differ only in how they turn a
group's rewards into advantages, so one runner serves both kinds.

Rewards are the stage's `rewards:` list, each weighted: shipped or user functions (guarded so that a
failure names the function), or reward models, checked here to be one-label sequence classifiers.
Before and after training, the policy samples completions for held-out prompts with a fixed seed and
the same rewards score them: the mean is the number RL is meant to raise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from align.errors import ModelError
from align.graph import reference_target
from align.models import load_tokenizer, resolve_model
from align.rewards import RewardSpec, guarded_function
from align.run.records import read_record
from align.stages.context import (
    ModelInput,
    StageContext,
    StageResult,
    load_stage_model,
    loss_curve,
    peft_config,
    stage_data,
    stage_tokenizer,
    write_log_history,
)
from align.stages.reward import merged_input
from align.trl_args import build_config

TRAINERS = {"grpo": "GRPOTrainer", "rloo": "RLOOTrainer"}
EVAL_SAMPLES = 4  # completions per held-out prompt
EVAL_ROWS = 64  # held-out prompts taken from the train data when the stage has no eval data
GENERATION_CHUNK = 64


def reward_model_folder(ctx: StageContext, value: str, field: str) -> str:
    """The folder a reward's `model` names: a reward stage's published output, or a folder or hub id."""
    target = reference_target(value)
    if target is None:
        return resolve_model(value, field)
    record = read_record(ctx.output_dir.parent / target)  # stage folders are siblings of this scratch folder
    if record is None or record.get("status") != "succeeded":
        raise ModelError(f"{field}: stage '{target}' has no finished output to read")
    return record["output"]["path"]


def reward_model_problem(folder: str) -> str | None:
    """Why a folder is not a reward model (a sequence-classification head with one label), or None."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder)
    architectures = config.architectures or []
    classifier = any(name.endswith("ForSequenceClassification") for name in architectures)
    if classifier and config.num_labels == 1:
        return None
    found = f"{config.num_labels} labels" if classifier else f"a {', '.join(architectures) or 'unnamed'} head"
    return (
        f"{folder} is not a reward model: it has {found}, and a reward model is a sequence-classification "
        "model with 1 label (what a `reward` stage writes)"
    )


def frozen_reward_model(ctx: StageContext, spec: RewardSpec, where: str) -> tuple[Any, Any]:
    """A frozen reward model and its tokenizer, refused with a clear message when it is not one."""
    from transformers import AutoModelForSequenceClassification

    folder = reward_model_folder(ctx, spec.model, f"{where}.model")
    if (problem := reward_model_problem(folder)) is not None:
        raise ModelError(f"{where}.model: {problem}")
    model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=ctx.dtype)
    return model.requires_grad_(False).eval(), load_tokenizer(folder)


def reward_sources(ctx: StageContext) -> tuple[list[Any], list[Any], list[str]]:
    """What TRL scores with, in the stage's order: callables or models, their tokenizers, their names."""
    sources, tokenizers, names = [], [], []
    for index, spec in enumerate(ctx.plan.stage.rewards):
        where = f"stages.{ctx.plan.name}.rewards[{index}]"
        if spec.function is not None:
            sources.append(guarded_function(spec.function, spec.args, where))
            tokenizers.append(None)
            name = spec.function.rsplit(".", 1)[-1]
        else:
            model, tokenizer = frozen_reward_model(ctx, spec, where)
            sources.append(model)
            tokenizers.append(tokenizer)
            name = "model"
        names.append(name if name not in names else f"{name}_{index}")
    return sources, tokenizers, names


def prompt_text(prompt: Any, tokenizer: Any) -> str:
    """A prompt as the policy sees it: chat-formatted with the generation prompt, or as written."""
    if isinstance(prompt, list):
        return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return prompt


def sample_completions(model: Any, tokenizer: Any, prompts: list[Any], config: Any, seed: int) -> list[Any]:
    """Sampled completions with the training temperature, in TRL's shape (messages for chat prompts)."""
    texts = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for start in range(0, len(prompts), GENERATION_CHUNK):
            chunk = [prompt_text(p, tokenizer) for p in prompts[start : start + GENERATION_CHUNK]]
            batch = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False).to(
                model.device
            )
            output = model.generate(
                **batch,
                do_sample=True,
                temperature=config.temperature,
                top_p=config.top_p,
                top_k=config.top_k or None,
                max_new_tokens=config.max_completion_length,
                pad_token_id=tokenizer.pad_token_id,
            )
            new_tokens = output[:, batch["input_ids"].shape[1] :]
            texts += tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
    return [
        [{"role": "assistant", "content": t}] if isinstance(p, list) else t
        for p, t in zip(prompts, texts, strict=True)
    ]


def model_scores(model: Any, tokenizer: Any, prompts: list[Any], completions: list[Any]) -> list[float]:
    """A reward model's scores, on the same text TRL gives it: chat-formatted prompt and completion."""
    scores = []
    for prompt, completion in zip(prompts, completions, strict=True):
        if isinstance(prompt, list):
            text = tokenizer.apply_chat_template(prompt + completion, tokenize=False)
        else:
            text = prompt + completion
        batch = tokenizer(text, return_tensors="pt", add_special_tokens=False).to(model.device)
        scores.append(float(model(**batch).logits[0, 0]))
    return scores


@torch.no_grad()
def held_out_rewards(
    trainer: Any, tokenizer: Any, rows: Any, names: list[str], seed: int
) -> dict[str, float]:
    """Mean weighted reward, and each reward's mean, of seeded samples for the held-out prompts."""
    model = trainer.model
    was_training = model.training
    model.eval()
    prompts = list(rows["prompt"]) * EVAL_SAMPLES
    completions = sample_completions(model, tokenizer, prompts, trainer.args, seed)
    model.train(was_training)
    columns = {key: list(rows[key]) * EVAL_SAMPLES for key in rows.column_names if key != "prompt"}
    means = {}
    for name, source, reward_tokenizer in zip(
        names, trainer.reward_funcs, trainer.reward_processing_classes, strict=True
    ):
        if isinstance(source, torch.nn.Module):
            values = model_scores(source, reward_tokenizer, prompts, completions)
        else:
            values = [v for v in source(prompts=prompts, completions=completions, **columns) if v is not None]
        means[f"reward_{name}"] = sum(values) / max(len(values), 1)
    weights = [float(w) for w in trainer.reward_weights]
    return {"reward_mean": sum(w * m for w, m in zip(weights, means.values(), strict=True)), **means}


@contextmanager
def policy_input(ctx: StageContext, beta: float) -> Iterator[StageContext]:
    """Where the policy loads from. With a KL term and full parameters, TRL re-loads the reference from
    the policy's folder, so earlier adapters are merged into one first; otherwise they merge in memory,
    and a saved adapter names a base that outlives this stage."""
    if beta == 0 or ctx.plan.stage.lora is not None or not ctx.model_input.adapters:
        yield ctx
        return
    with merged_input(ctx) as folder:
        yield dataclasses.replace(ctx, model_input=ModelInput(folder))


def run(ctx: StageContext) -> StageResult:
    """Measure held-out reward, train with the stage's rewards, measure again, and save the policy."""
    import trl

    stage = ctx.plan.stage
    lora = stage.lora
    train, evaluation = stage_data(stage, ctx.plan.name, "prompts")
    weights = [reward.weight for reward in stage.rewards]
    config = build_config(
        ctx.plan.kind,
        {**stage.trl, "reward_weights": weights},
        output_dir=str(ctx.output_dir / "checkpoints"),
        precision=ctx.plan.precision,
        seed=ctx.plan.seed,
        **ctx.backend.trainer_args(ctx.plan),
    )
    tokenizer = stage_tokenizer(ctx, padding_side="left")
    sources, reward_tokenizers, names = reward_sources(ctx)
    with policy_input(ctx, config.beta) as policy_ctx:
        trainer = getattr(trl, TRAINERS[ctx.plan.kind])(
            model=load_stage_model(policy_ctx, quantize_4bit=bool(lora and lora.load_in_4bit)),
            reward_funcs=sources,
            args=config,
            train_dataset=train,
            processing_class=tokenizer,
            reward_processing_classes=reward_tokenizers,
            callbacks=ctx.backend.callbacks(ctx.plan, ctx.output_dir / "logs"),
            peft_config=peft_config(lora),
        )
    ctx.backend.verify(trainer.model, ctx.plan)
    held_out = evaluation if evaluation is not None else train.select(range(min(EVAL_ROWS, len(train))))
    before = held_out_rewards(trainer, tokenizer, held_out, names, ctx.plan.seed)
    trainer.train(resume_from_checkpoint=config.resume_from_checkpoint)
    after = held_out_rewards(trainer, tokenizer, held_out, names, ctx.plan.seed)
    metrics = {f"{key}_before": value for key, value in before.items()}
    metrics.update({f"{key}_after": value for key, value in after.items()})
    output = "adapter" if lora else "model"
    trainer.save_model(str(ctx.output_dir / output))
    if ctx.is_main:
        tokenizer.save_pretrained(str(ctx.output_dir / output))
        metrics.update(loss_curve(write_log_history(trainer, ctx.output_dir), key="reward"))
    return StageResult(output=output, metrics=metrics)
