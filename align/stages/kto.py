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
from align.stages.context import StageContext, frozen_reference
from align.stages.preamble import preamble
from align.stages.training import Training, no_measure, suffixed, train_stage


def run(ctx: StageContext) -> StageResult:
    """Score held-out feedback, train, score it again, and save the adapter or model."""
    from trl import KTOTrainer

    where = ctx.plan.where
    precompute = ctx.plan.placement.reference == REFERENCE_PRECOMPUTED
    # TRL's collator pads right itself; a missing pad token becomes EOS
    start = preamble(ctx, {"precompute_ref_log_probs": True} if precompute else None)
    start.train = train = prompted(start.train, f"{where}.data.train")
    if start.evaluation is not None:
        start.evaluation = prompted(start.evaluation, f"{where}.data.eval")
    held_out = start.evaluation
    paired = held_out is not None and is_paired(held_out)
    if held_out is not None and not paired:
        both_labels(held_out, f"{where}.data.{'eval' if ctx.plan.stage.data.eval else 'train'}")
    tokenizer = start.tokenizer
    trainer = KTOTrainer(
        ref_model=frozen_reference(ctx),  # None: TRL disables the adapters, or precomputes
        **{
            **start.trainer_kwargs(train=unpaired(train)),
            "eval_dataset": None if held_out is None else unpaired(held_out),
        },
    )
    max_length = start.config.max_length or 1024

    def scores(phase: str) -> dict[str, float]:
        if paired:
            measured = preference_scores(trainer.model, tokenizer, held_out, max_length)
            # the same pairs, each completion scored on its own: a pair's margin averaged is that margin
            measured["label_margin"] = measured["preference_margin"]
        else:
            measured = label_scores(trainer.model, tokenizer, held_out, max_length)
        return suffixed(measured, phase)

    curves = (("loss", "loss"), ("kl", "kl"), ("rewards/margins", "reward_margin"))
    measure = scores if held_out is not None else no_measure
    prompts = start.sample_prompts()
    training = Training(
        trainer,
        tokenizer,
        start.output,
        held_out=measure,
        curves=curves,
        sample_prompts=prompts,
        counts=start.counts,
    )
    return train_stage(ctx, training)


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
