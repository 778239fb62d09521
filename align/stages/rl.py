"""What the online RL stages (grpo, rloo, ppo) share: their rewards, loaded and checked, and the held-out
measurement that says whether RL worked.

Rewards are the stage's `rewards:` list, each weighted: shipped or user functions (guarded so that a
failure names the function), or reward models, checked to be one-label sequence classifiers and placed as
the plan says. Before and after training, the policy samples completions for held-out prompts with a
fixed seed and the same rewards score them: the mean is the number RL is meant to raise.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch

from align.config.spec import RewardedStage
from align.errors import ModelError
from align.models.loading import load_pretrained, load_tokenizer
from align.planning.placement import REWARD_MODELS_SHARDED
from align.rewards import guarded_function
from align.stages.context import StageContext
from align.stages.signal import Scored, SignalWatch
from align.stages.training import suffixed
from align.trainers.sampling import decode, generate

EVAL_SAMPLES = 4  # completions per held-out prompt
GENERATION_CHUNK = 64


def reward_model_problem(folder: str, remote_code: bool = False) -> str | None:
    """Why a folder is not a reward model (a sequence-classification head with one label), or None."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder, trust_remote_code=remote_code)
    architectures = config.architectures or []
    classifier = any(name.endswith("ForSequenceClassification") for name in architectures)
    if classifier and config.num_labels == 1:
        return None
    found = f"{config.num_labels} labels" if classifier else f"a {', '.join(architectures) or 'unnamed'} head"
    return (
        f"{folder} is not a reward model: it has {found}, and a reward model is a sequence-classification "
        "model with 1 label (what a `reward` stage writes)"
    )


def frozen_reward_model(
    ctx: StageContext, folder: str, where: str, *, placed: bool, **load: Any
) -> tuple[Any, Any]:
    """A frozen reward model (the folder the controller resolved) and its tokenizer, refused with a clear
    message when it is not one.

    `placed`: loaded the way the backend places the policy (sharded under fsdp), as align's own PPO
    places it; TRL's trainers place the reward models they are given themselves. `load`: further
    `from_pretrained` arguments (a service's `device_map`).
    """
    from transformers import AutoModelForSequenceClassification

    remote_code = ctx.plan.remote_code
    if (problem := reward_model_problem(folder, remote_code)) is not None:
        raise ModelError(f"{where}.model: {problem}")
    kwargs = {"dtype": ctx.dtype, **(ctx.backend.model_kwargs(ctx.plan) if placed else {}), **load}
    model = load_pretrained(
        AutoModelForSequenceClassification, folder, trust_remote_code=remote_code, **kwargs
    )
    if placed:
        model = ctx.backend.prepare(model, ctx.plan)
    return model.requires_grad_(False).eval(), load_tokenizer(folder, trust_remote_code=remote_code)


@dataclass
class Rewards:
    """A stage's rewards in its order: callables or models, their tokenizers (None for a function),
    names (as logged) and weights; `latest`, the last batch scored here (what PPO's no-signal line shows)."""

    sources: list[Any]
    tokenizers: list[Any]
    names: list[str]
    weights: list[float]
    latest: Scored | None = None

    def score(
        self, prompts: list[Any], completions: list[Any], columns: dict[str, list[Any]]
    ) -> dict[str, list[float]]:
        """Each reward's value per completion; a function's None (no opinion) counts as 0."""
        values = {}
        for name, source, tokenizer in zip(self.names, self.sources, self.tokenizers, strict=True):
            if isinstance(source, torch.nn.Module):
                values[name] = model_scores(source, tokenizer, prompts, completions)
            else:
                found = source(prompts=prompts, completions=completions, **columns)
                values[name] = [0.0 if value is None else value for value in found]
        self.latest = Scored(list(completions), values)
        return values

    def total(self, values: dict[str, list[float]]) -> list[float]:
        """The weighted sum per completion."""
        columns = zip(*values.values(), strict=True)
        return [sum(w * v for w, v in zip(self.weights, row, strict=True)) for row in columns]


def stage_rewards(ctx: StageContext, remote: dict[int, Callable[..., list[float]]] | None = None) -> Rewards:
    """The stage's `rewards:` ready to score, any reward model held as the stage's placement says: on this
    rank, or in an actor of its own, called through `remote[index]` (align/stages/services.py)."""
    placed = ctx.plan.placement.reward_models == REWARD_MODELS_SHARDED
    sources, tokenizers, names = [], [], []
    for index, spec in enumerate(ctx.plan.rewards):
        where = f"stages.{ctx.plan.name}.rewards[{index}]"
        if spec.function is not None:
            sources.append(guarded_function(spec.function, spec.args, where))
            tokenizers.append(None)
            name = spec.function.rsplit(".", 1)[-1]
        elif remote and index in remote:
            sources.append(remote[index])
            tokenizers.append(None)
            name = "model"
        else:
            folder = ctx.inputs.reward_models[index]
            model, tokenizer = frozen_reward_model(ctx, folder, where, placed=placed)
            sources.append(model)
            tokenizers.append(tokenizer)
            name = "model"
        names.append(name if name not in names else f"{name}_{index}")
    return Rewards(sources, tokenizers, names, [reward.weight for reward in ctx.plan.rewards])


@torch.no_grad()
def model_scores(model: Any, tokenizer: Any, prompts: list[Any], completions: list[Any]) -> list[float]:
    """A reward model's scores, on the text TRL gives it: the chat-formatted prompt and completion.

    One forward per completion, so that every rank makes the same number of calls (a sharded model's
    forward is a collective) and no padding side can shift the scored token."""
    scores = []
    for prompt, completion in zip(prompts, completions, strict=True):
        if isinstance(prompt, list):
            text = tokenizer.apply_chat_template(prompt + completion, tokenize=False)
        else:
            text = prompt + completion
        batch = tokenizer(text, return_tensors="pt", add_special_tokens=False).to(model.device)
        scores.append(float(model(**batch).logits[0, 0]))
    return scores


def sample_completions(policy: Any, tokenizer: Any, prompts: list[Any], config: Any, seed: int) -> list[Any]:
    """Seeded completions with the training sampling settings, in TRL's shape."""
    completions = []
    synced = torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for start in range(0, len(prompts), GENERATION_CHUNK):
            chunk = prompts[start : start + GENERATION_CHUNK]
            sampled = generate(
                policy,
                tokenizer,
                chunk,
                max_new_tokens=config.max_completion_length,
                temperature=config.temperature,
                top_k=config.top_k or 0,
                top_p=config.top_p,
                stop_at_eos=getattr(config, "stop_token", "eos") == "eos",
                synced=synced,
            )
            completions += decode(tokenizer, sampled, chunk)
    return completions


@torch.no_grad()
def held_out_scores(
    policy: Any, tokenizer: Any, rows: Any, rewards: Rewards, config: Any, seed: int
) -> Scored:
    """Seeded samples for the held-out prompts, each reward's value and the weighted total of each."""
    was_training = policy.training
    policy.eval()
    prompts = list(rows["prompt"]) * EVAL_SAMPLES
    completions = sample_completions(policy, tokenizer, prompts, config, seed)
    policy.train(was_training)
    columns = {key: list(rows[key]) * EVAL_SAMPLES for key in rows.column_names if key != "prompt"}
    values = rewards.score(prompts, completions, columns)
    return Scored(completions, values, rewards.total(values))


def reward_means(scored: Scored) -> dict[str, float]:
    """Mean weighted reward (`reward_mean`), and each reward's mean (`reward_<name>`)."""
    means = {f"reward_{name}": sum(found) / max(len(found), 1) for name, found in scored.values.items()}
    totals = scored.totals or []
    return {"reward_mean": sum(totals) / max(len(totals), 1), **means}


@dataclass
class HeldOutRewards:
    """An RL stage's held-out measure: seeded samples for the held-out prompts, scored by the stage's rewards
    while `waited` is paused (the wait on reward services stops counting); before training, `watch` reads
    them for a start with nothing to learn from. `rows` None: nothing is held out, nothing is measured."""

    rows: Any
    rewards: Rewards
    config: Any
    tokenizer: Any
    seed: int
    paused: Callable[[], AbstractContextManager]
    watch: SignalWatch

    def measure(self, policy: Any, phase: str) -> dict[str, float]:
        """`reward_mean_<phase>` and each reward's mean, sampled from `policy`."""
        if self.rows is None:
            return {}
        with self.paused():
            scored = held_out_scores(policy, self.tokenizer, self.rows, self.rewards, self.config, self.seed)
        if phase == "before":
            self.watch.at_start(scored)
        return suffixed(reward_means(scored), phase)


def signal_watch(
    ctx: StageContext, config: Any, tokenizer: Any, latest: Callable[[], Scored | None], unit: str = "groups"
) -> SignalWatch:
    """The stage's watch for a run with nothing to learn from (align/stages/signal.py), as `no_signal:` sets
    it; `latest()` gives the latest batch of completions and their rewards."""
    limit, stage = config.max_completion_length, ctx.plan.stage
    settings = stage.no_signal if isinstance(stage, RewardedStage) else None
    return SignalWatch(settings, ctx.output_dir / "logs", latest, tokenizer, limit, unit)
