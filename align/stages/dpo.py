"""Direct preference optimisation with TRL's DPOTrainer.

The reference model follows the plan's placement: with LoRA it is the policy's base with the
adapters disabled (TRL does this when `ref_model` is None and the model carries adapters); for
full parameters it is a frozen copy loaded from the input model's folder, or, when the plan finds
that the copy does not fit, log-probs precomputed from the policy before it trains.
"""

from __future__ import annotations

from align.measures.heldout import preference_scores
from align.planning.placement import REFERENCE_PRECOMPUTED
from align.stages.context import StageContext, StageResult, frozen_reference
from align.stages.preamble import preamble
from align.stages.training import Training, no_measure, suffixed, train_stage


def run(ctx: StageContext) -> StageResult:
    """Score held-out pairs, train, score them again, and save the adapter or model."""
    from trl import DPOTrainer

    precompute = ctx.plan.placement.reference == REFERENCE_PRECOMPUTED
    # TRL's own DPO metrics on the held-out pairs before training come from its start-of-training evaluation
    overrides = {"precompute_ref_log_probs": True} if precompute else None
    start = preamble(ctx, overrides, padding_side="left", eval_on_start=True)
    config, tokenizer, evaluation = start.config, start.tokenizer, start.evaluation
    # ref_model None: TRL disables the adapters, or precomputes
    trainer = DPOTrainer(ref_model=frozen_reference(ctx), **start.trainer_kwargs())

    def scores(phase: str) -> dict[str, float]:
        """Two judgements of the held-out pairs: the policy's own log-probs (`preference_*`), and DPO's
        implicit reward against the reference (`dpo_reward_*`, what TRL reports as rewards/accuracies and
        rewards/margins; zero before training, when the policy is the reference)."""
        own = suffixed(
            preference_scores(trainer.model, tokenizer, evaluation, config.max_length or 1024), phase
        )
        if phase == "before":
            return own  # TRL's are logged by its evaluation at the start of train()
        trainer.evaluate()  # TRL logs its DPO metrics rather than returning them
        logged = [entry for entry in trainer.state.log_history if "eval_rewards/accuracies" in entry]
        return {
            **own,
            **suffixed(against_reference(logged[0]), "before"),
            **suffixed(against_reference(logged[-1]), "after"),
        }

    measure = scores if evaluation is not None else no_measure
    training = Training(
        trainer, tokenizer, start.output, held_out=measure, sample_prompts=start.sample_prompts()
    )
    return train_stage(ctx, training)


def against_reference(logged: dict[str, float]) -> dict[str, float]:
    """DPO's implicit reward of chosen over rejected, from one of TRL's logged evaluations."""
    return {
        "dpo_reward_accuracy": logged["eval_rewards/accuracies"],
        "dpo_reward_margin": logged["eval_rewards/margins"],
    }
