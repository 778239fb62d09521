"""Reference-free preference optimisation with TRL's experimental trainers: ORPO (`kind: orpo`, SFT's NLL plus
an odds-ratio term) and CPO (`kind: cpo`; with `loss_type: simpo` and `cpo_alpha: 0` it is SimPO). Neither
reads a reference model, so the plan places none and counts none.

Held out, the policy's own judgement of the pairs (`preference_*`: the share where chosen has the higher
log-probability, and the mean margin), the measure these objectives move without a reference.
"""

from __future__ import annotations

import importlib
from typing import Any

from align.measures.heldout import preference_scores
from align.records import StageResult
from align.stages.context import StageContext, stage_tokenizer
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

TRAINERS = {"orpo": "trl.experimental.orpo.ORPOTrainer", "cpo": "trl.experimental.cpo.CPOTrainer"}
CURVES = (("loss", "loss"), ("rewards/margins", "reward_margin"), ("nll_loss", "nll"))
"""TRL's logged loss, its implicit reward margin (beta x the policy's log-prob margin, no reference) and the
NLL of chosen its loss includes: their first and last values are recorded."""


def run(ctx: StageContext) -> StageResult:
    """Score held-out pairs, train, score them again, and save the adapter or model."""
    module, _, name = TRAINERS[ctx.plan.kind].rpartition(".")
    trainer_class = getattr(importlib.import_module(module), name)
    data = load_data(ctx)
    tokenizer = stage_tokenizer(ctx)  # the trainer tokenizes and pads its pairs itself
    config = trl_config(ctx, data, tokenizer)
    counts = data.mixture | count_rows(ctx, data.train, tokenizer, config)
    policy = load_policy(ctx)
    trainer = trainer_class(**trainer_arguments(ctx, policy, config, tokenizer, data.train, data.evaluation))
    max_length = config.max_length or 1024
    prompts, output, model = held_out_prompts(ctx, data), output_folder(ctx), trainer.model

    clocks = start_clocks(ctx, trainer)
    ready(ctx, model, model)
    metrics = pair_scores(trainer.model, tokenizer, data.evaluation, max_length, "before")
    clocks.lap("measure_before")
    before = sampled(clocks, "before", model, tokenizer, prompts)
    checksums = trainable_checksums(model)
    train(ctx, trainer, clocks)
    metrics |= pair_scores(trainer.model, tokenizer, data.evaluation, max_length, "after")
    clocks.lap("measure_after")
    after = sampled(clocks, "after", model, tokenizer, prompts)
    metrics |= {**trained(trainer, model, checksums, clocks), **counts}
    save_output(ctx, trainer, output)
    metrics |= published(ctx, trainer, tokenizer, output, CURVES)
    return finished(clocks, metrics, trainer, output, (prompts, before, after))


def pair_scores(model: Any, tokenizer: Any, rows: Any, max_length: int, phase: str) -> dict[str, float]:
    """The policy's own judgement of the held-out pairs (`preference_*_<phase>`); nothing when none."""
    if rows is None:
        return {}
    return suffixed(preference_scores(model, tokenizer, rows, max_length), phase)
