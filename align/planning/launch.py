"""What launching adds to a stage's plan. The plan is decided once, by `build`, and never changed; each time
the controller starts a stage it builds a `Launch` beside it: the folders the stage reads (resolved from the
records of the stages before it), its config with each hub dataset pinned to a commit, its resources with
the stages started beside it, and its memory priced now that its model is present. The launcher, the
workers' config and each rank's StageContext carry the Launch; nothing rewrites the plan."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from align.backends import BACKENDS
from align.config.spec import KINDS, Pipeline, StageBase
from align.models.memory import MemoryEstimate
from align.planning.inputs import StageInputs
from align.planning.lora import trained_rows
from align.planning.model_sizes import reward_model_params, stage_architecture, teacher_params
from align.planning.plan import StagePlan
from align.planning.resources import Request
from align.planning.workload import workload


@dataclass(frozen=True)
class Launch:
    """One start of a stage: its plan, as decided, and what the controller adds when it starts it."""

    plan: StagePlan
    inputs: StageInputs
    stage: StageBase  # the plan's config with each hub dataset pinned (align/run/inputs.py `pinned`)
    resources: Request | None = None  # the plan's, with `alongside` the stages started beside it
    memory: MemoryEstimate | None = None  # the plan's, or priced at launch (`priced`)
    memory_by_backend: dict[str, MemoryEstimate] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def where(self) -> str:
        return self.plan.where


def launch_of(plan: StagePlan, inputs: StageInputs) -> Launch:
    """The launch of a stage reading `inputs`, with everything else as planned."""
    return Launch(plan, inputs, plan.stage, plan.resources, plan.memory, plan.memory_by_backend)


def beside(launch: Launch, alongside: int) -> Launch:
    """The launch told how many stages run side by side with it, itself included (`Request.alongside`)."""
    if launch.resources is None:
        return launch
    return replace(launch, resources=replace(launch.resources, alongside=alongside))


def priced(pipeline: Pipeline, launch: Launch) -> Launch:
    """The launch with its memory plan. The plan made before the run has none when its model was not present
    yet (a builtin built on first use); by launch it is, so it is priced then, for the disk check and the
    record. The backend and placement stay the ones planned: only the bytes are filled in."""
    stage = launch.plan
    arch = stage_architecture(pipeline, stage.name) if KINDS[stage.kind].trains else None
    if launch.memory is not None or arch is None:
        return launch
    rewards = reward_model_params(pipeline, stage.name, arch)
    teacher = teacher_params(pipeline, stage.name, arch)
    by_backend = {}
    for backend in BACKENDS.values():
        rows = trained_rows(stage.stage, stage.chat_template, backend.frozen_sharded, arch)
        work = workload(stage.stage, stage.precision, stage.placement, arch, rewards, rows, teacher)
        by_backend.update(backend.estimates(arch, work, stage.workers, stage.stage))
    chosen = by_backend[BACKENDS[stage.backend].option(stage.stage)]
    return replace(launch, memory=chosen, memory_by_backend=by_backend)
