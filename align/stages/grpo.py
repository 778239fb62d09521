"""Online RL on prompts with TRL's GRPOTrainer or RLOOTrainer; the two differ only in how they turn a
group's rewards into advantages, so one runner serves both kinds. Rewards and the held-out measurement
are shared with PPO (align/stages/rl.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from align.compat.trl import kept_generation_batch
from align.planning.plan import ModelInput
from align.records import StageResult
from align.stages.context import StageContext, merged_input, stage_tokenizer
from align.stages.preamble import (
    held_out_prompts,
    load_data,
    load_policy,
    output_folder,
    trainer_arguments,
    trl_config,
)
from align.stages.rl import HeldOutRewards, signal_watch, stage_rewards
from align.stages.rollout_clock import timed
from align.stages.services import Waited, remote_rewards
from align.stages.signal import Scored
from align.stages.training import (
    finished,
    published,
    ready,
    sampled,
    save_output,
    start_clocks,
    train,
    trainable_checksums,
    trained,
)

TRAINERS = {"grpo": "GRPOTrainer", "rloo": "RLOOTrainer"}
CURVES = (("reward", "reward"),)  # the logged reward: its first and last values are recorded


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
    if beta == 0 or ctx.plan.lora is not None or not ctx.model_input.adapters:
        yield ctx
        return
    with merged_input(ctx) as folder:
        yield ctx.with_model(ModelInput(folder))


def run(ctx: StageContext) -> StageResult:
    """Measure held-out reward, train with the stage's rewards, measure again, and save the policy."""
    import trl

    waited = Waited()  # on reward models in actors of their own, within the rollout's time
    rewards = stage_rewards(ctx, remote_rewards(ctx, waited))
    data = load_data(ctx)
    tokenizer = stage_tokenizer(ctx, padding_side="left")
    config = trl_config(ctx, data, tokenizer, {"reward_weights": rewards.weights})
    with policy_input(ctx, config.beta) as policy_ctx:
        policy = load_policy(policy_ctx)
        trainer = timed(getattr(trl, TRAINERS[ctx.plan.kind]))(
            reward_funcs=rewards.sources,
            reward_processing_classes=rewards.tokenizers,
            **trainer_arguments(ctx, policy, config, tokenizer, data.train, None),
        )
    watch = signal_watch(ctx, config, tokenizer, lambda: latest_batch(trainer))
    trainer.add_callback(watch)
    seed, paused = ctx.plan.seed, waited.paused
    held_out = HeldOutRewards(data.evaluation, rewards, config, tokenizer, seed, paused, watch)
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
    metrics |= trained(trainer, model, checksums, clocks)
    metrics |= {**trainer.rollout_split(), **waited.split(), **watch.metrics()}
    save_output(ctx, trainer, output)
    metrics |= published(ctx, trainer, tokenizer, output, CURVES)
    return finished(clocks, metrics, trainer, output, (prompts, before, after))
