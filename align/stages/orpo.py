"""Reference-free preference optimisation with TRL's experimental trainers: ORPO (`kind: orpo`, SFT's NLL plus
an odds-ratio term) and CPO (`kind: cpo`; with `loss_type: simpo` and `cpo_alpha: 0` it is SimPO). Neither
reads a reference model, so the plan places none and counts none.

Held out, the policy's own judgement of the pairs (`preference_*`: the share where chosen has the higher
log-probability, and the mean margin), the measure these objectives move without a reference.
"""

from __future__ import annotations

import importlib

from align.measures.heldout import preference_scores
from align.records import StageResult
from align.stages.context import StageContext
from align.stages.preamble import preamble
from align.stages.training import Training, no_measure, suffixed, train_stage

TRAINERS = {"orpo": "trl.experimental.orpo.ORPOTrainer", "cpo": "trl.experimental.cpo.CPOTrainer"}
CURVES = (("loss", "loss"), ("rewards/margins", "reward_margin"), ("nll_loss", "nll"))
"""TRL's logged loss, its implicit reward margin (beta x the policy's log-prob margin, no reference) and the
NLL of chosen its loss includes: their first and last values are recorded."""


def run(ctx: StageContext) -> StageResult:
    """Score held-out pairs, train, score them again, and save the adapter or model."""
    module, _, name = TRAINERS[ctx.plan.kind].rpartition(".")
    trainer_class = getattr(importlib.import_module(module), name)
    start = preamble(ctx)  # the trainer tokenizes and pads its pairs itself
    trainer = trainer_class(**start.trainer_kwargs())
    evaluation, tokenizer = start.evaluation, start.tokenizer
    max_length = start.config.max_length or 1024

    def scores(phase: str) -> dict[str, float]:
        return suffixed(preference_scores(trainer.model, tokenizer, evaluation, max_length), phase)

    training = Training(
        trainer,
        tokenizer,
        start.output,
        held_out=scores if evaluation is not None else no_measure,
        curves=CURVES,
        sample_prompts=start.sample_prompts(),
        counts=start.counts,
    )
    return train_stage(ctx, training)
