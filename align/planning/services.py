"""Frozen models placed in Ray actors of their own (`placement: actor`): what each asks Ray for, what its
weights take on its own device, and what the ranks call on it. The plan counts them here, not in the
training ranks' memory table; align/run/services.py starts them and the stage runners call them.

The calls are written once, here, as one protocol per role (`CALLS`): align/stages/services.py's models
implement them, and align/run/services.py's actor and client carry any of them by name, so a new call is
one method here and one there, never a third copy in the driver."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from align.config.placement import ServiceResources
from align.config.spec import RewardedStage, StageBase, TrainingStage
from align.errors import Problem
from align.models.memory import DTYPE_BYTES, format_bytes
from align.models.placement import Role
from align.planning.hardware import Host
from align.planning.resources import Request

if TYPE_CHECKING:
    from torch import Tensor

REFERENCE_ROLE = Role.REFERENCE.value


def reward_role(index: int) -> str:
    """The key of a reward model's service: its YAML path under the stage, as the plan prints it."""
    return f"rewards[{index}]"


class RewardCalls(Protocol):
    """What the ranks call on a reward model in its own actor."""

    def score(self, prompts: list[Any], completions: list[Any]) -> list[float]:
        """One score per (prompt, completion) text pair, as a rank scores them with its own copy."""
        ...


class ReferenceCalls(Protocol):
    """What the ranks call on a reference in its own actor; tensors travel on the CPU."""

    def log_probs(
        self, input_ids: Tensor, attention_mask: Tensor, prompt_length: int, temperature: float
    ) -> Tensor:
        """PPO's: the per-token log-probs of each completion (after `prompt_length`)."""
        ...

    def fused_log_probs(self, inputs: dict[str, Tensor]) -> Tensor:
        """DPO's: per-token log-probs of the `labels` through TRL's fused LM head (-100: not scored)."""
        ...


CALLS: dict[Role, type] = {Role.REWARD: RewardCalls, Role.REFERENCE: ReferenceCalls}
"""Each role that can be placed in an actor, and the protocol its actor answers."""


def call_names(role: Role) -> frozenset[str]:
    """The methods a service of `role` answers, as its protocol declares them."""
    return frozenset(name for name in vars(CALLS[role]) if not name.startswith("_"))


SERVICE_CALLS = frozenset().union(*(call_names(role) for role in CALLS))
"""Every method any service answers: what a client may forward."""


@dataclass(frozen=True)
class Service:
    """One frozen model in a Ray actor of its own, called by every training rank of its stage.

    role: `rewards[i]` (a reward model, loaded from `inputs.reward_models[i]`) or `reference` (the stage's
    input model, frozen). cpus None: 0 on an embedded Ray (the ranks share every core already), 1 on a
    cluster. weight_bytes: its weights in `dtype`, on its own device.
    """

    role: str
    cpus: float | None
    gpus: float
    wait_s: float
    weight_bytes: int
    dtype: str

    @property
    def is_reward(self) -> bool:
        return self.role != REFERENCE_ROLE

    @property
    def kind(self) -> Role:
        """Which model it is: a reward model or the reference."""
        return Role.REWARD if self.is_reward else Role.REFERENCE

    @property
    def index(self) -> int:
        """A reward model's index in `rewards:`."""
        return int(self.role.removeprefix("rewards[").removesuffix("]"))

    def num_cpus(self, embedded: bool) -> float:
        return self.cpus if self.cpus is not None else (0.0 if embedded else 1.0)

    def describe(self) -> str:
        cpus = f"{self.cpus:g}" if self.cpus is not None else "0 embedded, 1 on a cluster"
        gpus = f", GPU: {self.gpus:g}" if self.gpus else ""
        weights = (
            f"{format_bytes(self.weight_bytes)} of {self.dtype} weights"
            if self.weight_bytes
            else "its weights"
        )
        if self.gpus > 1:
            each = format_bytes(int(self.weight_bytes / self.gpus))
            where = f"over {self.gpus:g} GPUs of its own ({each} each)"
        else:
            where = "on a GPU of its own" if self.gpus else "in its own process"
        return f"a Ray actor {{CPU: {cpus}{gpus}}}; {weights} {where}, in no rank's memory below"


def stage_services(
    stage: StageBase, accelerator: bool, policy_params: int, reward_params: dict[int, int], dtype: str
) -> tuple[Service, ...]:
    """Every frozen model of `stage` placed in an actor of its own; a reference copy has the policy's size."""
    width = DTYPE_BYTES[dtype]
    found = []
    reference = stage.reference if isinstance(stage, TrainingStage) else None
    if reference is not None and reference.as_actor:
        found.append(service(REFERENCE_ROLE, reference.resources, accelerator, policy_params * width, dtype))
    for index, reward in enumerate(stage.rewards if isinstance(stage, RewardedStage) else []):
        if reward.as_actor:
            size = reward_params.get(index, 0) * width
            resources = reward.resources or ServiceResources()
            found.append(service(reward_role(index), resources, accelerator, size, dtype))
    return tuple(found)


def service(role: str, asked: ServiceResources, accelerator: bool, size: int, dtype: str) -> Service:
    gpus = asked.gpus if asked.gpus is not None else (1.0 if accelerator else 0.0)
    return Service(role, asked.cpus, gpus, asked.wait_s, size, dtype)


def local_problems(name: str, services: tuple[Service, ...], ranks: Request, host: Host) -> list[Problem]:
    """What this machine's embedded Ray could never give a stage's services beside its ranks (they would
    wait `wait_s` for nothing): CPUs asked beside ranks that share every core, GPUs beyond the machine's."""
    cores, gpus_here = host.cores, host.gpus
    cpus = cores if ranks.cpus is None else ranks.cpus * ranks.workers
    gpus = ranks.gpus * ranks.workers
    problems = []
    for service in services:
        where = f"stages.{name}.{service.role}.resources"
        cpus, gpus = cpus + service.num_cpus(embedded=True), gpus + service.gpus
        if cpus > cores:
            problems.append(
                Problem(
                    f"{where}.cpus",
                    f"the ranks and actors ask {cpus:g} CPUs; this machine has {cores}: leave `cpus` out (an "
                    "actor takes none of its own on an embedded Ray), or run on a cluster with --address",
                )
            )
        if gpus > gpus_here:
            problems.append(
                Problem(
                    f"{where}.gpus",
                    f"the ranks and actors ask {gpus:g} GPUs; this machine has {gpus_here}: `gpus: 0` runs "
                    "it on the CPU; or fewer workers, or a cluster with --address",
                )
            )
    return problems
