"""The rows a stage's trainer trains on, prepared by the trainer's own code, and what `max_length` does to
them: `align data` shows them, and every stage counts them before its model loads.

TRL prepares rows in its trainer's constructor (chat template, tokenization, loss masks). align runs that
same method (align/compat/trl.py) with the stage's own tokenizer and config, but no length limit, so that the
counts see every row whole (align/data/lengths.py applies the cut as TRL does). `datasets` caches each step
by its fingerprint: the trainer built next reads what was prepared here (SFT's padding-free default asks
for exactly this), and preference trainers reuse the tokenized rows before they filter.
"""

from __future__ import annotations

import copy
from typing import Any

from align.compat.trl import prepare_dataset
from align.data.lengths import LengthReport, length_report, lengths_path, remember, share
from align.data.loss_scope import LossScope
from align.errors import StageFailed
from align.planning.losses import stage_loss_scope

TRAINERS = {"sft": "SFTTrainer", "dpo": "DPOTrainer", "kto": "KTOTrainer", "reward": "RewardTrainer"}
"""The kinds whose trainer prepares (tokenizes and masks) rows up front; the RL kinds render prompts as
they generate."""


def decided_loss(ctx: Any, tokenizer: Any, train: Any) -> LossScope | None:
    """What carries loss in an SFT stage's rows, decided by align/planning/losses.py as `align plan` decides
    it, under the template the stage's tokenizer now holds and on its first training row. None for the other
    kinds."""
    from align.models.chat_templates import ChatTemplate

    plan = ctx.plan
    text = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
    named = plan.chat_template.source if plan.chat_template is not None else f"of {plan.model_source}"
    template = ChatTemplate(named, text) if text is not None else None
    return stage_loss_scope(plan.stage, template, plan.model_source, row=train[0] if len(train) else {})


def loss_settings(ctx: Any, tokenizer: Any, train: Any) -> dict[str, Any]:
    """TRL's `assistant_only_loss` as decided; the stage stops here, before the model loads, when tool rows
    would carry loss."""
    scope = decided_loss(ctx, tokenizer, train)
    if scope is None:
        return {}
    if scope.problem is not None:
        raise StageFailed(f"{ctx.plan.where}.data.train: {scope.problem}")
    return {"assistant_only_loss": scope.assistant_only}


def trainer_attributes(kind: str, tokenizer: Any, config: Any, sample: dict[str, Any]) -> dict[str, Any]:
    """The public attributes a trainer's row preparation reads from its trainer, set as its constructor
    sets them (trl/trainer/sft_trainer.py), so that it runs without a model (align/compat/trl.py)."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    view: dict[str, Any] = {"chat_template": None}
    if kind == "sft":
        if config.assistant_only_loss and not has_generation_markers(tokenizer.chat_template):
            view["chat_template"] = get_training_chat_template(tokenizer)
        only = config.completion_only_loss
        prompt_completion = "prompt" in sample and "completion" in sample
        view["completion_only_loss"] = prompt_completion if only is None else only
    if kind == "kto":  # its KL completions and its desirability weights (trl/trainer/kto_trainer.py)
        view["calculate_KL"] = config.loss_type != "apo_zero_unpaired"
        view["desirable_weight"] = config.desirable_weight
        view["undesirable_weight"] = config.undesirable_weight
    return view


def prepare(kind: str, dataset: Any, tokenizer: Any, config: Any, name: str = "train") -> Any:
    """`dataset` as the `kind` trainer prepares it, with no length limit (cached by `datasets`)."""
    import trl

    whole = copy.copy(config)
    whole.max_length = None
    trainer = getattr(trl, TRAINERS[kind])
    attributes = trainer_attributes(kind, tokenizer, whole, dataset[0])
    return prepare_dataset(trainer, attributes, dataset, tokenizer, whole, name)


def cut(config: Any) -> tuple[int | None, str]:
    """The length limit the trainer applies and from which end it keeps tokens."""
    return getattr(config, "max_length", None), getattr(config, "truncation_mode", "keep_start")


def report_of(kind: str, prepared: Any, config: Any) -> LengthReport:
    from align.data.mapped_pages import release_mapped_pages

    report = length_report(prepared.data.table, kind, *cut(config))
    release_mapped_pages()  # the counts read every row: nothing of it need stay resident
    return report


EMPTIED_SHARE = 0.01
"""The share of rows a stage may lose to the cut unless `data.max_emptied_share` says otherwise: rows left
with no loss-bearing token and pairs left identical, which train nothing."""
CUT_ANSWERS_SHARE = 0.25
"""The share of conversations that may lose part of their last answer unless `data.max_cut_answers_share`
says otherwise. Such a row still trains the answer's start, but never its end (the model does not learn to
stop): above EMPTIED_SHARE the stage says so as it starts, above this it stops. Chat data cut at a short
max_length loses some answers (the shipped chatterbot rows: 12% at 64 tokens); most lost is a mistake."""


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


def allowed_cut_answers(plan: Any) -> float:
    own = plan.stage.data.max_cut_answers_share
    return CUT_ANSWERS_SHARE if own is None else own


def lost_parts(kind: str, report: LengthReport) -> list[str]:
    """Each way the cut loses rows, counted with its own share, in words."""
    rows, parts = report.rows, []
    if report.emptied:
        lost = (
            "are longer than it, and TRL's reward trainer drops them"
            if kind == "reward"
            else "keep no loss-bearing token"
        )
        parts.append(f"{report.emptied:,} of {rows:,} rows ({share(report.emptied, rows)}) {lost}")
    if report.answers_cut:
        parts.append(
            f"{report.answers_cut:,} of {rows:,} rows ({share(report.answers_cut, rows)}) lose their last "
            "answer, wholly or in part"
        )
    if report.identical:
        parts.append(
            f"{report.identical:,} of {rows:,} pairs ({share(report.identical, rows)}) are identical after it"
        )
    return parts


def lost_rows_problem(plan: Any, report: LengthReport | None) -> str | None:
    """What is wrong when more than the allowed share of the rows teach nothing at the cut (no loss-bearing
    token, identical pairs), or more than theirs lose part of their last answer. None within both shares."""
    if report is None or report.max_length is None or not report.rows:
        return None
    allowed, allowed_cut = allowed_share(plan), allowed_cut_answers(plan)
    nothing = (report.emptied + report.identical) / report.rows
    if nothing <= allowed and report.answers_cut / report.rows <= allowed_cut:
        return None
    keeps = max(report.keeps_all, report.keeps_answers) if report.answers_cut else report.keeps_all
    keeps = report.longest if report.identical else keeps
    return (
        f"{plan.where}: at trl.max_length {report.max_length:,}, {'; '.join(lost_parts(plan.kind, report))}: "
        f"above data.max_emptied_share {allowed:g} (rows that train nothing) or data.max_cut_answers_share "
        f"{allowed_cut:g} (p95 length {report.p95:,}); set trl.max_length: {keeps:,} to keep them, or drop "
        "those rows, or raise the share to train without them"
    )


def cut_answers_note(plan: Any, report: LengthReport | None) -> str | None:
    """A line for a stage that trains on, though more answers are cut than rows may train nothing."""
    if report is None or report.max_length is None or not report.rows:
        return None
    if report.answers_cut / report.rows <= allowed_share(plan):
        return None
    return (
        f"{report.answers_cut:,} of {report.rows:,} rows ({share(report.answers_cut, report.rows)}) lose "
        f"part of their last answer at trl.max_length {report.max_length:,}: they never train its end "
        f"(max_length {report.keeps_answers:,} keeps every answer; data.max_cut_answers_share "
        f"{allowed_cut_answers(plan):g} stops the stage)"
    )


def refuse_lost_rows(plan: Any, report: LengthReport | None) -> None:
    """Stop before the model loads when the cut leaves too many rows nothing, or something else, to learn."""
    if (problem := lost_rows_problem(plan, report)) is not None:
        raise StageFailed(problem)
