"""The rows a stage's trainer trains on, prepared by the trainer's own code, and what `max_length` does to
them: `align data` shows them, and every stage counts them before its model loads.

TRL prepares rows in its trainer's constructor (`_prepare_dataset`: chat template, tokenization, loss masks).
align runs that same method with the stage's own tokenizer and config, but no length limit, so that the
counts see every row whole (align/data/lengths.py applies the cut as TRL does). `datasets` caches each step
by its fingerprint: the trainer built next reads what was prepared here (SFT's padding-free default asks
for exactly this), and preference trainers reuse the tokenized rows before they filter.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

from align.data.lengths import LengthReport, length_report, lengths_path, remember
from align.errors import StageFailed

TRAINERS = {"sft": "SFTTrainer", "dpo": "DPOTrainer", "kto": "KTOTrainer", "reward": "RewardTrainer"}
"""The kinds whose trainer prepares (tokenizes and masks) rows up front; the RL kinds render prompts as
they generate."""


def trainer_view(kind: str, tokenizer: Any, config: Any, sample: dict[str, Any]) -> Any:
    """The attributes a trainer's `_prepare_dataset` reads from its trainer, set as its constructor sets
    them (trl/trainer/sft_trainer.py), so that the method runs without a model."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    view = SimpleNamespace(_tokenizer=tokenizer, _is_vision_dataset=False, chat_template=None)
    if kind == "sft":
        if config.assistant_only_loss and not has_generation_markers(tokenizer.chat_template):
            view.chat_template = get_training_chat_template(tokenizer)
        only = config.completion_only_loss
        view.completion_only_loss = ("prompt" in sample and "completion" in sample) if only is None else only
    if kind == "kto":  # its KL completions and its desirability weights (trl/trainer/kto_trainer.py)
        view.calculate_KL = config.loss_type != "apo_zero_unpaired"
        view.desirable_weight, view.undesirable_weight = config.desirable_weight, config.undesirable_weight
    return view


def prepare(kind: str, dataset: Any, tokenizer: Any, config: Any, name: str = "train") -> Any:
    """`dataset` as the `kind` trainer prepares it, with no length limit (cached by `datasets`)."""
    import trl

    whole = copy.copy(config)
    whole.max_length = None
    trainer = getattr(trl, TRAINERS[kind])
    view = trainer_view(kind, tokenizer, whole, dataset[0])
    if kind == "sft":
        return trainer._prepare_dataset(view, dataset, tokenizer, whole, False, None, name)
    return trainer._prepare_dataset(view, dataset, tokenizer, whole, name)


def cut(config: Any) -> tuple[int | None, str]:
    """The length limit the trainer applies and from which end it keeps tokens."""
    return getattr(config, "max_length", None), getattr(config, "truncation_mode", "keep_start")


def report_of(kind: str, prepared: Any, config: Any) -> LengthReport:
    from align.data.mapped_pages import release_mapped_pages

    report = length_report(prepared.data.table, kind, *cut(config))
    release_mapped_pages()  # the counts read every row: nothing of it need stay resident
    return report


EMPTIED_SHARE = 0.01
"""The share of rows a stage may lose to the cut (every loss-bearing token) unless `data.max_emptied_share`
says otherwise."""


def counted_lengths(ctx: Any, train: Any, tokenizer: Any, config: Any) -> LengthReport | None:
    """The counts over the rows the stage's trainer will prepare, kept for `align plan`. None for the kinds
    whose trainer prepares no rows up front."""
    kind = ctx.plan.kind
    if kind not in TRAINERS:
        return None
    report = report_of(kind, prepare(kind, train, tokenizer, config), config)
    if ctx.is_main:
        remember(lengths_path(ctx.plan), report)
    return report


def allowed_share(plan: Any) -> float:
    own = plan.stage.data.max_emptied_share
    return EMPTIED_SHARE if own is None else own


def empty_rows_problem(plan: Any, report: LengthReport | None) -> str | None:
    """What is wrong when more than the allowed share of the rows lose every loss-bearing token to the cut:
    they would count as rows and train nothing. None when it is within the share."""
    allowed = allowed_share(plan)
    if report is None or report.max_length is None or report.emptied_share <= allowed:
        return None
    lost = (
        f"are longer than trl.max_length {report.max_length:,}, and TRL's reward trainer drops them"
        if plan.kind == "reward"
        else f"keep no loss-bearing token at trl.max_length {report.max_length:,}"
    )
    return (
        f"{plan.where}: {report.emptied:,} of {report.rows:,} rows "
        f"({100 * report.emptied_share:.1f}%) {lost} (p95 length {report.p95:,}); set "
        f"trl.max_length: {report.keeps_all:,} to keep them, or raise data.max_emptied_share "
        f"(now {allowed:g}) to train without them"
    )


def refuse_empty_rows(plan: Any, report: LengthReport | None) -> None:
    """Stop before the model loads when the cut leaves too many rows nothing to learn."""
    if (problem := empty_rows_problem(plan, report)) is not None:
        raise StageFailed(problem)
