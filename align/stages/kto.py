"""Kahneman-Tversky optimisation with TRL's KTOTrainer, on unpaired feedback.

Data is TRL's unpaired format (prompt, completion, label), or (completion, label) whose prompt is split
off here, or preference pairs, which are unpaired here: each pair gives a desirable and an undesirable
row. TRL estimates KTO's KL term by giving each prompt in a batch the completion of the row before it,
in file order (it samples sequentially), so unpaired rows alternate desirable and undesirable and each
undesirable row comes from a pair half the data away: every batch holds both labels, and no prompt is
scored against its own pair's reply as if that were a mismatched one.

The reference follows the plan's placement, as for DPO: with LoRA the policy's base with the adapters
disabled; for full parameters a frozen copy of the input model, or log-probs precomputed from the
policy before it trains.
"""

from __future__ import annotations

from typing import Any

from align.errors import DataError
from align.measures.heldout import label_scores, preference_scores
from align.planning.placement import REFERENCE_PRECOMPUTED
from align.records import StageResult
from align.stages.context import StageContext, frozen_reference, stage_tokenizer
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
    suffixed,
    train,
    trainable_checksums,
    trained,
)

CURVES = (("loss", "loss"), ("kl", "kl"), ("rewards/margins", "reward_margin"))
"""TRL's logged loss, KL estimate and reward margin: their first and last values are recorded."""


def run(ctx: StageContext) -> StageResult:
    """Score held-out feedback, train, score it again, and save the adapter or model."""
    from trl import KTOTrainer

    where = ctx.plan.where
    precompute = ctx.plan.placement.reference == REFERENCE_PRECOMPUTED
    data = load_data(ctx)
    tokenizer = stage_tokenizer(ctx)  # TRL's collator pads right itself; a missing pad token becomes EOS
    config = trl_config(ctx, data, tokenizer, {"precompute_ref_log_probs": True} if precompute else None)
    data.train = prompted(data.train, f"{where}.data.train")
    if data.evaluation is not None:
        data.evaluation = prompted(data.evaluation, f"{where}.data.eval")
        if not is_paired(data.evaluation):
            both_labels(data.evaluation, f"{where}.data.{'eval' if ctx.plan.data.eval else 'train'}")
    train_rows = unpaired(data.train)
    counts = data.mixture | count_rows(ctx, train_rows, tokenizer, config)
    reference = frozen_reference(ctx)  # None: TRL disables the adapters, or precomputes
    policy = load_policy(ctx)
    held_out = None if data.evaluation is None else unpaired(data.evaluation)
    trainer = KTOTrainer(
        ref_model=reference, **trainer_arguments(ctx, policy, config, tokenizer, train_rows, held_out)
    )
    max_length = config.max_length or 1024
    prompts, output, model = held_out_prompts(ctx, data), output_folder(ctx), trainer.model

    clocks = start_clocks(ctx, trainer)
    ready(ctx, model, model)
    metrics = feedback_scores(trainer.model, tokenizer, data.evaluation, max_length, "before")
    clocks.lap("measure_before")
    before = sampled(clocks, "before", model, tokenizer, prompts)
    checksums = trainable_checksums(model)
    train(ctx, trainer, clocks)
    metrics |= feedback_scores(trainer.model, tokenizer, data.evaluation, max_length, "after")
    clocks.lap("measure_after")
    after = sampled(clocks, "after", model, tokenizer, prompts)
    metrics |= {**trained(trainer, model, checksums, clocks), **counts}
    save_output(ctx, trainer, output)
    metrics |= published(ctx, trainer, tokenizer, output, CURVES)
    return finished(clocks, metrics, trainer, output, (prompts, before, after))


def feedback_scores(model: Any, tokenizer: Any, rows: Any, max_length: int, phase: str) -> dict[str, float]:
    """The held-out feedback scored by `model`: pairs by their preference margin (each completion scored on
    its own, so a pair's margin averaged is the label margin too), unpaired rows by label. None: nothing."""
    if rows is None:
        return {}
    if is_paired(rows):
        measured = preference_scores(model, tokenizer, rows, max_length)
        measured["label_margin"] = measured["preference_margin"]
    else:
        measured = label_scores(model, tokenizer, rows, max_length)
    return suffixed(measured, phase)


def is_paired(dataset: Any) -> bool:
    return "label" not in dataset.column_names


def prompted(dataset: Any, field: str) -> Any:
    """The rows with a `prompt` column. Pairs without one get the turns their replies share (TRL's
    `extract_prompt`); unpaired rows without one get an empty text prompt, or for a conversation every turn
    before its last. A conversational prompt must not be empty: TRL could not tell the rows' format."""
    from trl.data_utils import extract_prompt

    if "prompt" not in dataset.column_names:
        split = extract_prompt if is_paired(dataset) else split_completion
        dataset = dataset.map(split, desc="Extracting prompts")
    empty = [
        index for index, prompt in enumerate(dataset["prompt"]) if isinstance(prompt, list) and not prompt
    ]
    if empty:
        raise DataError(
            f"{field}: row {empty[0]} ({len(empty)} row{'s' if len(empty) > 1 else ''} in all) has a "
            "conversation with no turn before its reply; give a `prompt` column, or the user turn it answers"
        )
    return dataset


def split_completion(row: dict[str, Any]) -> dict[str, Any]:
    completion = row["completion"]
    if isinstance(completion, str):
        return {"prompt": "", "completion": completion}
    return {"prompt": completion[:-1], "completion": completion[-1:]}


def unpaired(dataset: Any) -> Any:
    """TRL's unpaired rows: as given, or from pairs by TRL's `unpair_preference_dataset` (which keeps the
    pairs' order among the desirable rows and among the undesirable ones), reordered so that they alternate
    and the undesirable row beside a pair's desirable one comes from the pair half the data away."""
    from trl.data_utils import unpair_preference_dataset

    if not is_paired(dataset):
        return dataset
    rows = unpair_preference_dataset(dataset)
    labels = rows["label"]
    desirable = [index for index, label in enumerate(labels) if label]
    undesirable = [index for index, label in enumerate(labels) if not label]
    shift = len(desirable) // 2
    count = len(desirable)
    order = [i for n in range(count) for i in (desirable[n], undesirable[(n + shift) % count])]
    return rows.select(order).flatten_indices()


def both_labels(dataset: Any, field: str) -> None:
    """The held-out measure compares desirable with undesirable completions: refuse data without both."""
    labels = [bool(label) for label in dataset["label"]]
    if all(labels) or not any(labels):
        which = "desirable" if all(labels) else "undesirable"
        raise DataError(
            f"{field}: every row is {which} (label {all(labels)}); KTO's held-out measure (label_margin) "
            "compares desirable with undesirable completions, so the data must hold both"
        )
