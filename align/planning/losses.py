"""The loss a stage trains with, in words, for `align plan`: the named variants people ask for (IPO, RPO,
Dr. GRPO, GSPO, ORPO, SimPO...) are settings of TRL's configs, and the plan says which one a `trl:` block
picks and whether it reads a reference model.

The plan reads the `trl:` block without importing TRL (validate has checked it), so TRL's defaults for these
settings are written here; tests/test_variants.py holds them to TRL's own config classes.
"""

from __future__ import annotations

from typing import Any

from align.config.spec import StageBase

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
