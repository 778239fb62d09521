"""The stage side of frozen models placed in Ray actors of their own (`placement: actor`).

What such an actor holds and computes (a reward model's scores, a reference's per-token log-probs) is
built here from the plan exactly as the co-located path builds it (same loader, dtype and forward), so the
numbers match. A runner gets, for each service the plan places, a client in `StageContext.services`: any
object with the calls align/planning/services.py declares for its role (`RewardCalls.score`;
`ReferenceCalls.log_probs`, `fused_log_probs`); align/run/services.py makes them, and Ray stays there.
`Waited` counts the seconds the ranks spend waiting on them, for the record's time split.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import torch

from align.backends import BACKENDS
from align.errors import AlignError
from align.models.placement import Placement
from align.planning.launch import Launch
from align.planning.placement import REFERENCE_ACTOR
from align.planning.services import (
    REFERENCE_ROLE,
    ReferenceCalls,
    RewardCalls,
    Service,
    reward_role,
)
from align.stages.context import StageContext, frozen_reference, load_stage_model
from align.stages.rl import frozen_reward_model, model_scores
from align.trainers.policy_value import completion_log_probs


def service_context(launch: Launch) -> StageContext:
    """A context for loading a service's model whole in one process: the ddp backend neither shards nor
    wraps, whatever the ranks run under; nothing is written."""
    where = Path(tempfile.gettempdir())
    return StageContext(plan=launch.plan, output_dir=where, backend=BACKENDS["ddp"], launch=launch)


def spread_over_gpus(device: torch.device) -> dict[str, str]:
    """An actor given several GPUs (`resources: {gpus: 2}`) spreads its model's layers over them."""
    return {"device_map": "auto"} if device.type == "cuda" and torch.cuda.device_count() > 1 else {}


class RewardModelService(RewardCalls):
    """`rewards[i].model` whole on the actor's device: scores of (prompt, completion) texts, as a rank
    scores them with its own copy (align/stages/rl.py `model_scores`)."""

    def __init__(self, launch: Launch, index: int, device: torch.device) -> None:
        where, spread = f"{launch.where}.rewards[{index}]", spread_over_gpus(device)
        model, self.tokenizer = frozen_reward_model(
            service_context(launch), launch.inputs.reward_models[index], where, placed=False, **spread
        )
        self.model = model if spread else model.to(device)

    def score(self, prompts: list[Any], completions: list[Any]) -> list[float]:
        return model_scores(self.model, self.tokenizer, prompts, completions)


class ReferenceService(ReferenceCalls):
    """The stage's input model, frozen, whole on the actor's device: PPO's reference log-probs, and DPO's
    through TRL's fused LM head, which DPOTrainer adds to a reference copy (a forward without
    `fused_lm_head=True` is the model's own)."""

    def __init__(self, launch: Launch, device: torch.device) -> None:
        from trl.trainer.utils import add_fused_lm_head

        model = load_stage_model(service_context(launch), frozen=True)
        self.model, self.device = model.requires_grad_(False).eval().to(device), device
        add_fused_lm_head(self.model)

    @torch.no_grad()
    def fused_log_probs(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Per-token log-probs of the `labels` (-100: not scored), as TRL's DPO asks a reference for them."""
        moved = {key: value.to(self.device) for key, value in inputs.items()}
        return self.model(**moved, use_cache=False, fused_lm_head=True).log_probs.cpu()

    @torch.no_grad()
    def log_probs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int, temperature: float
    ) -> torch.Tensor:
        ids, mask = input_ids.to(self.device), attention_mask.to(self.device)
        return completion_log_probs(self.model, ids, mask, prompt_length, temperature).cpu()


def start_service(launch: Launch, service: Service, device: torch.device) -> RewardCalls | ReferenceCalls:
    """What the actor for `service` holds (run inside it)."""
    if service.role == REFERENCE_ROLE:
        return ReferenceService(launch, device)
    return RewardModelService(launch, service.index, device)


@dataclass
class Waited:
    """Seconds the ranks spent waiting on their services (each remote round trip) while training; the
    held-out measurements before and after are `paused` out of it."""

    seconds: float = 0.0
    counting: bool = True

    def timed(self, call: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                if self.counting:
                    self.seconds += time.perf_counter() - started

        return run

    @contextmanager
    def paused(self) -> Iterator[None]:
        self.counting = False
        try:
            yield
        finally:
            self.counting = True

    def split(self) -> dict[str, float]:
        """`time_service_wait_s`: part of `time_score_s` for PPO, of the rollout for GRPO/RLOO."""
        return {"time_service_wait_s": self.seconds}


def client(ctx: StageContext, role: str) -> Any:
    """This rank's client of the service `role`, which the driver starts for every stage it launches."""
    if role not in ctx.services:
        raise AlignError(
            f"{ctx.plan.where}: the plan places {role} in a Ray actor of its own, and none was started for "
            f"this run: run it with `align run`, or place it `{Placement.WITH_POLICY}`"
        )
    return ctx.services[role]


def reward_client(ctx: StageContext, index: int) -> RewardCalls:
    return cast(RewardCalls, client(ctx, reward_role(index)))


def reference_client(ctx: StageContext) -> ReferenceCalls:
    return cast(ReferenceCalls, client(ctx, REFERENCE_ROLE))


def remote_rewards(ctx: StageContext, waited: Waited) -> dict[int, Callable[..., list[float]]]:
    """Each reward model the plan places in an actor, as a reward function by its index in `rewards:`."""
    return {
        index: remote_reward(reward_client(ctx, index), Path(ctx.inputs.reward_models[index]).name, waited)
        for index in ctx.plan.placement.actor_rewards
    }


def remote_reward(service: RewardCalls, name: str, waited: Waited) -> Callable[..., list[float]]:
    """A reward model in its own actor as a reward function (TRL's shape: keyword arguments, one float per
    completion): rule functions and remote models then score alike, on every rank. `name`: its folder's,
    under which TRL logs a reward model it holds itself (`rewards/NAME/mean`)."""

    def score(prompts: list[Any], completions: list[Any], **_: Any) -> list[float]:
        return waited.timed(service.score)(prompts, completions)

    score.__name__ = name
    return score


def ppo_reference(ctx: StageContext, waited: Waited) -> Any:
    """PPO's reference as the plan places it: in an actor of its own, a frozen copy here, or None (LoRA:
    the policy with its adapters disabled)."""
    if ctx.plan.placement.reference == REFERENCE_ACTOR:
        return remote_reference(reference_client(ctx), waited)
    return frozen_reference(ctx)


def remote_reference(service: ReferenceCalls, waited: Waited) -> Callable[..., torch.Tensor]:
    """PPO's reference in its own actor (align/trainers/ppo.py `ReferenceFn`): token batches go to it on the
    CPU, its log-probs come back to the rank's device."""

    def log_probs(ids: torch.Tensor, mask: torch.Tensor, prompt_length: int, temperature: float):
        found = waited.timed(service.log_probs)(ids.cpu(), mask.cpu(), prompt_length, temperature)
        return found.to(ids.device)

    return log_probs


class RemoteForward:
    """DPO's reference in its own actor, called as TRL calls a reference copy's forward
    (`model(**inputs, labels=labels, fused_lm_head=True).log_probs`): the tensors go to the service."""

    def __init__(self, service: ReferenceCalls, waited: Waited) -> None:
        self.service, self.waited = service, waited

    def __call__(self, **kwargs: Any) -> SimpleNamespace:
        tensors = {key: value for key, value in kwargs.items() if isinstance(value, torch.Tensor)}
        found = self.waited.timed(self.service.fused_log_probs)({k: v.cpu() for k, v in tensors.items()})
        return SimpleNamespace(log_probs=found.to(tensors["input_ids"].device))


def with_remote_reference(trainer_class: type, ctx: StageContext, waited: Waited) -> type:
    """DPOTrainer computing its precomputed reference log-probs (`precompute_ref_log_probs`, before
    training, over the train and eval pairs) in the reference's own actor, with TRL's own batching,
    masking and sums: only the forward moves, so no rank holds a reference."""
    forward = RemoteForward(reference_client(ctx), waited)

    class ReferenceInActor(trainer_class):
        def compute_ref_log_probs(self, model: Any, inputs: dict[str, Any]) -> Any:
            return super().compute_ref_log_probs(forward, inputs)

    return ReferenceInActor
