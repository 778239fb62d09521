"""The loss a stage trains with, in words, for `align plan`: the named variants people ask for (IPO, RPO,
Dr. GRPO, GSPO, ORPO, SimPO...) are settings of TRL's configs, and the plan says which one a `trl:` block
picks and whether it reads a reference model.

The plan reads the `trl:` block without importing TRL (validate has checked it), so TRL's defaults for these
settings are written here; tests/test_variants.py holds them to TRL's own config classes.
"""

from __future__ import annotations

from typing import Any

from align.config.spec import KINDS, StageBase
from align.data.loss_scope import LossScope, first_training_row, row_format, sft_loss_scope, tool_rows
from align.models.chat_templates import ChatTemplate, marks_assistant_turns, model_template

DEFAULTS = {
    "dpo": {"loss_type": ["sigmoid"], "beta": 0.1},
    "grpo": {"loss_type": "dapo", "importance_sampling_level": "token"},
    "cpo": {"loss_type": "sigmoid", "cpo_alpha": 1.0},
    "distill": {"beta": 1.0},
}
"""TRL 1.16's defaults of the settings read here, by kind."""

DPO_LOSSES = {
    "sigmoid": "DPO (sigmoid of the reward margin, reference-based)",
    "ipo": "IPO (squared distance of the margin to 1/(2 beta), reference-based)",
    "robust": "robust DPO (sigmoid corrected for flipped labels, reference-based)",
    "hinge": "SLiC hinge on the margin (reference-based)",
    "apo_zero": "APO-zero (chosen pushed up, rejected down, each against the reference)",
    "apo_down": "APO-down (both pushed down, rejected more, against the reference)",
    "sft": "SFT (negative log-likelihood of chosen, no reference)",
}
GRPO_LOSSES = {
    "grpo": "GRPO (token losses averaged per sequence, then over the batch)",
    "dapo": "DAPO (token losses over the active tokens of the accumulated batch)",
    "dr_grpo": "Dr. GRPO (token losses over a constant, max_completion_length: no length bias)",
    "bnpo": "BNPO (token losses over the active tokens of the local batch)",
    "cispo": "CISPO (clipped importance weights times the log-probs)",
}
CPO_LOSSES = {
    "sigmoid": "CPO (sigmoid of the policy's own margin, reference-free)",
    "hinge": "CPO hinge (reference-free)",
    "ipo": "CPO with IPO's squared margin (reference-free)",
    "simpo": "SimPO (length-normalised margin over the target gamma, reference-free)",
}


def setting(stage: StageBase, key: str) -> Any:
    return stage.trl.get(key, DEFAULTS.get(stage.kind, {}).get(key))


def dpo_words(stage: StageBase) -> str:
    losses = setting(stage, "loss_type")
    losses = [losses] if isinstance(losses, str) else list(losses)
    weights = stage.trl.get("loss_weights") or [1.0] * len(losses)
    named = [DPO_LOSSES.get(loss, f"{loss} (TRL's DPO loss_type)") for loss in losses]
    if len(losses) == 1:
        return named[0]
    terms = " + ".join(f"{weight:g} x {words}" for weight, words in zip(weights, named, strict=True))
    return f"RPO: {terms}" if sorted(losses) == ["sft", "sigmoid"] else terms


def grpo_words(stage: StageBase) -> str:
    loss = setting(stage, "loss_type")
    words = GRPO_LOSSES.get(loss, f"{loss} (TRL's GRPO loss_type)")
    if setting(stage, "importance_sampling_level") == "sequence":
        return f"GSPO: sequence-level importance ratio, {words}"
    return words


def cpo_words(stage: StageBase) -> str:
    loss = setting(stage, "loss_type")
    words = CPO_LOSSES.get(loss, f"{loss} (TRL's CPO loss_type)")
    alpha = setting(stage, "cpo_alpha")
    return f"{words}, plus {alpha:g} x NLL of chosen" if alpha else words


def loss_words(stage: StageBase) -> str | None:
    """The stage's loss in words, or None for a kind with one loss and no variants."""
    kind = stage.kind
    if kind == "dpo":
        return dpo_words(stage)
    if kind == "grpo":
        return grpo_words(stage)
    if kind == "cpo":
        return cpo_words(stage)
    if kind == "orpo":
        return "ORPO (NLL of chosen plus beta x the log odds ratio of chosen over rejected, reference-free)"
    if kind == "distill":
        beta = float(setting(stage, "beta"))
        named = {0.0: "forward KL(teacher || student)", 1.0: "reverse KL(student || teacher)"}
        return f"generalized JSD at beta {beta:g}: {named.get(beta, 'a mix of both KLs')}, on-policy"
    return None


def stage_loss_scope(
    stage: StageBase, template: ChatTemplate | None, model: str, row: dict[str, Any] | None = None
) -> LossScope | None:
    """What carries loss in an SFT stage's rows (align/data/loss_scope.py): under the stage's `template`,
    else the chat template of its root `model` (None: not known before it is present); judged on `row`, by
    default the first training row of its data. None for the other kinds, whose loss is on completions."""
    if stage.kind != "sft":
        return None
    text = template.text if template is not None else model_template(model)
    named = template.source if template is not None else f"of {model}"
    markable = None if text is None else marks_assistant_turns(text)
    row = first_training_row(stage.data) if row is None else row
    return sft_loss_scope(
        stage.trl, row_format(row), markable, tool_rows(stage.data, KINDS["sft"].data), named
    )


PAIRS = "the chosen and rejected completions (the prompt masked)"
SAMPLED = "the completions it samples (the prompt masked)"
CARRIES = {
    "dpo": PAIRS,
    "orpo": PAIRS,
    "cpo": PAIRS,
    "kto": "the completions (the prompt masked)",
    "reward": "none by token: a score at the last token of each side",
    "grpo": SAMPLED,
    "rloo": SAMPLED,
    "ppo": SAMPLED,
    "distill": SAMPLED,
}
"""What carries loss in the kinds other than SFT."""


def carries_loss(stage: StageBase, template: ChatTemplate | None, model: str) -> str | None:
    """`align plan`'s line for a stage that trains: which tokens carry loss."""
    scope = stage_loss_scope(stage, template, model)
    if scope is not None:
        return scope.words + (f"; refused: {scope.problem}" if scope.problem else "")
    return CARRIES.get(stage.kind)
