"""Direct preference optimisation with TRL's DPOTrainer.

The reference model follows the plan's placement: with LoRA it is the policy's base with the
adapters disabled (TRL does this when `ref_model` is None and the model carries adapters); for
full parameters it is a frozen copy loaded from the input model's folder, or, when the plan finds
that the copy does not fit, log-probs precomputed from the policy before it trains, or (`reference:
{placement: actor}`) log-probs precomputed by a copy in a Ray actor of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from align.measures.heldout import PairLogprobs, pair_logprobs
from align.planning.placement import REFERENCE_ACTOR, REFERENCE_PRECOMPUTED
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
from align.stages.services import Waited, with_remote_reference
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

CURVES = (("loss", "loss"),)  # the logged loss: its first and last values are recorded


def run(ctx: StageContext) -> StageResult:
    """Score held-out pairs, train, score them again, and save the adapter or model."""
    from trl import DPOTrainer

    in_actor = ctx.plan.placement.reference == REFERENCE_ACTOR
    precompute = in_actor or ctx.plan.placement.reference == REFERENCE_PRECOMPUTED
    data = load_data(ctx)
    tokenizer = stage_tokenizer(ctx, padding_side="left")
    config = trl_config(ctx, data, tokenizer, {"precompute_ref_log_probs": True} if precompute else None)
    counts = data.mixture | count_rows(ctx, data.train, tokenizer, config)
    waited = Waited()  # on the reference's actor, which precomputes every pair's log-probs
    trainer_class = with_remote_reference(DPOTrainer, ctx, waited) if in_actor else DPOTrainer
    # None: TRL disables the adapters, or precomputes (in the reference's actor, or from the policy)
    reference = frozen_reference(ctx)
    policy = load_policy(ctx)
    arguments = trainer_arguments(ctx, policy, config, tokenizer, data.train, data.evaluation)
    trainer = trainer_class(ref_model=reference, **arguments)
    held_out = HeldOutPairs(tokenizer, data.evaluation, config.max_length or 1024, config.beta)
    prompts, output, model = held_out_prompts(ctx, data), output_folder(ctx), trainer.model

    clocks = start_clocks(ctx, trainer)
    ready(ctx, model, model)
    metrics = held_out.measure(trainer.model, "before")
    clocks.lap("measure_before")
    before = sampled(clocks, "before", model, tokenizer, prompts)
    checksums = trainable_checksums(model)
    train(ctx, trainer, clocks)
    metrics |= held_out.measure(trainer.model, "after")
    clocks.lap("measure_after")
    after = sampled(clocks, "after", model, tokenizer, prompts)
    metrics |= {
        **trained(trainer, model, checksums, clocks),
        **(waited.split() if in_actor else {}),
        **counts,
    }
    save_output(ctx, trainer, output)
    metrics |= published(ctx, trainer, tokenizer, output, CURVES)
    return finished(clocks, metrics, trainer, output, (prompts, before, after))


@dataclass
class HeldOutPairs:
    """Two judgements of the held-out pairs from one pass of the policy per phase: its own log-probs
    (`preference_*`), and DPO's implicit reward against the reference (`dpo_reward_*`, what TRL reports as
    rewards/chosen, rejected, accuracies and margins).

    The reference is the policy as training starts (LoRA's B is zero, a full-parameter reference is a copy of
    the same weights), so the pass before training gives the reference's log-probs too: no evaluation by the
    trainer, before or after, and no pass of the reference (TRL's evaluation at the start took 11.6 s of a
    SmolLM2 stage and scored each pair with both models; docs/performance.md). Before training every implicit
    reward is 0 and every pair ties: counted half, as in any win rate (TRL counts a tie as wrong, and its
    accuracy 0 read as "learned from zero"); `dpo_reward_ties_before` says so."""

    tokenizer: Any
    rows: Any  # None: nothing held out, nothing measured
    max_length: int
    beta: float
    reference: PairLogprobs | None = None

    def measure(self, model: Any, phase: str) -> dict[str, float]:
        if self.rows is None:
            return {}
        policy = pair_logprobs(model, self.tokenizer, self.rows, self.max_length)
        own = policy.scores()
        if self.reference is None:  # before training: the policy is the reference
            self.reference = policy
        implicit = implicit_rewards(policy, self.reference, self.beta)
        chosen_logprob = sum(policy.chosen) / len(policy.chosen)
        return suffixed({**own, "chosen_logprob": chosen_logprob, **implicit}, phase)


def implicit_rewards(policy: PairLogprobs, reference: PairLogprobs, beta: float) -> dict[str, float]:
    """DPO's implicit rewards, beta x (policy - reference log-prob), averaged over the pairs: of chosen, of
    rejected, their margin, and the share of pairs whose chosen reward is above rejected's (ties half)."""
    chosen = [beta * (p - r) for p, r in zip(policy.chosen, reference.chosen, strict=True)]
    rejected = [beta * (p - r) for p, r in zip(policy.rejected, reference.rejected, strict=True)]
    margins = [c - r for c, r in zip(chosen, rejected, strict=True)]
    count = len(margins)
    found = {
        "dpo_reward_chosen": sum(chosen) / count,
        "dpo_reward_rejected": sum(rejected) / count,
        "dpo_reward_margin": sum(margins) / count,
        "dpo_reward_accuracy": sum(1.0 if m > 0 else 0.5 if m == 0 else 0.0 for m in margins) / count,
    }
    ties = sum(m == 0 for m in margins) / count
    return {**found, "dpo_reward_ties": ties} if ties else found
