"""Direct preference optimisation with TRL's DPOTrainer.

The reference model follows the plan's placement: with LoRA it is the policy's base with the
adapters disabled (TRL does this when `ref_model` is None and the model carries adapters); for
full parameters it is a frozen copy loaded from the input model's folder, or, when the plan finds
that the copy does not fit, log-probs precomputed from the policy before it trains, or (`reference:
{placement: actor}`) log-probs precomputed by a copy in a Ray actor of its own.
"""

from __future__ import annotations

from align.measures.heldout import preference_scores
from align.planning.placement import REFERENCE_ACTOR, REFERENCE_PRECOMPUTED
from align.stages.context import StageContext, StageResult, frozen_reference
from align.stages.preamble import preamble
from align.stages.services import Waited, with_remote_reference
from align.stages.training import Training, no_measure, suffixed, train_stage


def run(ctx: StageContext) -> StageResult:
    """Score held-out pairs, train, score them again, and save the adapter or model."""
    from trl import DPOTrainer

    in_actor = ctx.plan.placement.reference == REFERENCE_ACTOR
    precompute = in_actor or ctx.plan.placement.reference == REFERENCE_PRECOMPUTED
    # TRL's own DPO metrics on the held-out pairs before training come from its start-of-training evaluation
    overrides = {"precompute_ref_log_probs": True} if precompute else None
    start = preamble(ctx, overrides, padding_side="left", eval_on_start=True)
    config, tokenizer, evaluation = start.config, start.tokenizer, start.evaluation
    waited = Waited()  # on the reference's actor, which precomputes every pair's log-probs
    trainer_class = with_remote_reference(DPOTrainer, ctx, waited) if in_actor else DPOTrainer
    # ref_model None: TRL disables the adapters, or precomputes (in the reference's actor, or from the policy)
    trainer = trainer_class(ref_model=frozen_reference(ctx), **start.trainer_kwargs())

    def scores(phase: str) -> dict[str, float]:
        """Two judgements of the held-out pairs: the policy's own log-probs (`preference_*`), and DPO's
        implicit reward against the reference (`dpo_reward_*`, what TRL reports as rewards/accuracies and
        rewards/margins; before training, when the policy is the reference, every pair ties: 0.5)."""
        own = suffixed(
            preference_scores(trainer.model, tokenizer, evaluation, config.max_length or 1024), phase
        )
        if phase == "before":
            return own  # TRL's are logged by its evaluation at the start of train()
        trainer.evaluate()  # TRL logs its DPO metrics rather than returning them
        logged = [entry for entry in trainer.state.log_history if "eval_rewards/accuracies" in entry]
        return {
            **own,
            **suffixed(against_reference(logged[0], before=True), "before"),
            **suffixed(against_reference(logged[-1]), "after"),
        }

    measure = scores if evaluation is not None else no_measure
    training = Training(
        trainer,
        tokenizer,
        start.output,
        held_out=measure,
        sample_prompts=start.sample_prompts(),
        run_metrics=waited.split if in_actor else dict,
        counts=start.counts,
    )
    return train_stage(ctx, training)


def against_reference(logged: dict[str, float], *, before: bool = False) -> dict[str, float]:
    """DPO's implicit reward of chosen over rejected, from one of TRL's logged evaluations.

    TRL counts a pair as right only when chosen's reward is strictly above rejected's, so a tie counts as
    wrong. Before training the policy is the reference (LoRA's B starts at zero; a full-parameter reference
    is a copy): every implicit reward is 0 and every pair ties, which TRL reports as accuracy 0, read as
    "learned from zero". Ties count half here, as in any win rate: 0.5, and `dpo_reward_ties` says so."""
    accuracy = logged["eval_rewards/accuracies"]
    found = {"dpo_reward_margin": logged["eval_rewards/margins"]}
    sides = ("eval_rewards/chosen", "eval_rewards/rejected", "eval_rewards/margins")
    if before and all(logged.get(key) == 0.0 for key in sides):  # the policy equals the reference
        accuracy, found["dpo_reward_ties"] = 0.5, 1.0
    return {"dpo_reward_accuracy": accuracy, **found}
