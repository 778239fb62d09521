"""Online RL on prompts with TRL's GRPOTrainer or RLOOTrainer; the two differ only in how they turn a
group's rewards into advantages, so one runner serves both kinds. Rewards and the held-out measurement
are shared with PPO (align/stages/rl.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from align.compat.trl import kept_generation_batch
from align.planning.plan import ModelInput
from align.stages.context import StageContext, StageResult, merged_input
from align.stages.preamble import preamble
from align.stages.rl import held_out_measure, signal_watch, stage_rewards
from align.stages.rollout_clock import timed
from align.stages.services import Waited, remote_rewards
from align.stages.signal import Scored
from align.stages.training import Training, train_stage

TRAINERS = {"grpo": "GRPOTrainer", "rloo": "RLOOTrainer"}


def latest_batch(trainer: Any) -> Scored | None:
    """The last generation batch, every rank's, as TRL keeps it for its completions table (the completions
    and each reward's value by the name TRL logs it under)."""
    kept = kept_generation_batch(trainer)
    if not kept or not kept.get("completion"):
        return None
    return Scored(list(kept["completion"]), {name: list(values) for name, values in kept["rewards"].items()})


@contextmanager
def policy_input(ctx: StageContext, beta: float) -> Iterator[StageContext]:
    """Where the policy loads from. With a KL term and full parameters, TRL re-loads the reference from
    the policy's folder, so earlier adapters are merged into one first; otherwise they merge in memory,
    and a saved adapter names a base that outlives this stage."""
    if beta == 0 or ctx.plan.stage.lora is not None or not ctx.model_input.adapters:
        yield ctx
        return
    with merged_input(ctx) as folder:
        yield ctx.with_model(ModelInput(folder))


def run(ctx: StageContext) -> StageResult:
    """Measure held-out reward, train with the stage's rewards, measure again, and save the policy."""
    import trl

    waited = Waited()  # on reward models in actors of their own, within the rollout's time
    rewards = stage_rewards(ctx, remote_rewards(ctx, waited))
    start = preamble(ctx, {"reward_weights": rewards.weights}, padding_side="left")
    config, tokenizer = start.config, start.tokenizer
    with policy_input(ctx, config.beta) as policy_ctx:
        policy = start.load_model(policy_ctx)
        trainer = timed(getattr(trl, TRAINERS[ctx.plan.kind]))(
            reward_funcs=rewards.sources,
            reward_processing_classes=rewards.tokenizers,
            **{**start.trainer_kwargs(policy), "eval_dataset": None},
        )
    watch = signal_watch(start, lambda: latest_batch(trainer))
    trainer.add_callback(watch)
    measure = held_out_measure(start, lambda: trainer.model, rewards, waited.paused, watch)
    training = Training(
        trainer,
        tokenizer,
        start.output,
        held_out=measure,
        curves=(("reward", "reward"),),
        sample_prompts=start.sample_prompts(),
        run_metrics=lambda: {**trainer.rollout_split(), **waited.split(), **watch.metrics()},
    )
    return train_stage(ctx, training)
