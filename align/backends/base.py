"""What a distributed backend is to align: a small typed interface.

A backend knows DeepSpeed or FSDP and nothing of DPO or PPO. The plan asks it, before Ray starts, what it
cannot run (`problems`), how it holds the policy and frozen models, and what that costs per rank
(`estimates`); a worker asks it how to load, wrap, train and check the models. A stage runner never
tests which backend it has. Torch-side work is imported inside the methods: the plan must stay light.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from align.errors import Problem
from align.models.memory import MemoryEstimate, Workload

if TYPE_CHECKING:
    from align.config.spec import StageBase
    from align.models.architectures import Architecture


class PlannedStage(Protocol):
    """What a backend reads of a stage's plan (`align.planning.plan.StagePlan` has these fields). Named
    here so that backends need not import the plan, which imports them."""

    name: str
    stage: StageBase
    workers: int
    precision: str
    accelerator: bool
    offload_optimizer: bool


class Backend(Protocol):
    name: str
    titles: dict[str, str]  # each `estimates` column as the plan's reasons name it
    policy_held: str  # how each rank holds the trained model, in words
    frozen_sharded: bool  # a frozen copy (reference, reward model) is sharded like the policy
    keeps_fp32_master: bool  # under mixed precision its engine holds 16-bit weights and steps an fp32 copy

    def problems(self, stage: StageBase, where: str, workers: int, precision: str) -> list[Problem]:
        """What this backend cannot run for the stage, each with its YAML path (empty: it can)."""

    def offloads_optimizer(self, stage: StageBase) -> bool:
        """Whether it steps the optimizer on the host for this stage."""

    def needs_process_group(self, workers: int) -> bool:
        """Whether its ranks must join a process group. Where none is needed the rank runs as a plain
        script does: with a distributed environment, Accelerate wraps even one CPU rank in DDP."""

    def estimates(self, arch: Architecture, work: Workload, workers: int, stage: StageBase) -> dict:
        """Per-rank memory as {table column: MemoryEstimate}; `option(stage)` names the column it runs."""

    def option(self, stage: StageBase) -> str:
        """The `estimates` column this backend runs the stage with."""

    def model_kwargs(self, plan: PlannedStage) -> dict[str, Any]:
        """Extra `from_pretrained` arguments."""

    def prepare(self, model: Any, plan: PlannedStage) -> Any:
        """Wrapping or sharding after load (and after earlier adapters merge)."""

    def trainer_args(self, plan: PlannedStage) -> dict[str, Any]:
        """Extra `TrainingArguments` fields (e.g. `deepspeed=`)."""

    def callbacks(self, plan: PlannedStage, logs_dir: Path) -> list[Any]:
        """Trainer callbacks: the per-rank placement report, engine checks, checkpoints."""

    def verify(self, model: Any, plan: PlannedStage) -> None:
        """Fail loudly if the backend did not do what it claims (e.g. no sharding)."""


def estimate_for(
    backend: Backend, arch: Architecture, work: Workload, workers: int, stage: Any
) -> MemoryEstimate:
    """The per-rank memory of the stage as `backend` would run it."""
    return backend.estimates(arch, work, workers, stage)[backend.option(stage)]
