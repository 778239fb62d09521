"""What every decision about one stage reads, gathered once before the plan makes any (planning/plan.py's
`plan_stage`): its ranks, precision, model architecture, LoRA targets, the frozen models it prices, and its
chat template."""

from __future__ import annotations

from dataclasses import dataclass

from align.config.spec import KINDS, Pipeline, StageBase
from align.models.architectures import Architecture, LoraTargets
from align.models.chat_templates import ChatTemplate, resolve_template
from align.models.precision import resolve_precision
from align.pipeline.trl_args import trl_setting
from align.planning.hardware import Hardware
from align.planning.lora import lora_targets
from align.planning.model_sizes import reward_model_params, stage_architecture, teacher_params


@dataclass(frozen=True)
class StageFacts:
    pipeline: Pipeline
    name: str
    hardware: Hardware
    stage: StageBase
    trains: bool
    workers: int
    precision: str
    arch: Architecture | None  # None when the model's shape is unknown (or the stage trains nothing)
    targets: LoraTargets | None
    rewards: dict[int, int]  # each reward model's parameters, by its index in `rewards:`
    teacher: int  # a distill stage's teacher's parameters (0 for other kinds)
    precompute_asked: bool  # its `trl:` block computes the reference's log-probs before training
    template: ChatTemplate | None

    @property
    def where(self) -> str:
        return f"stages.{self.name}"


def stage_facts(pipeline: Pipeline, name: str, hardware: Hardware) -> StageFacts:
    """Read in the order the plan always read them, so that the first refusal of a stage stays the same."""
    stage = pipeline.stages[name]
    trains = KINDS[stage.kind].trains
    workers = pipeline.stage_setting(name, "workers") if KINDS[stage.kind].ranked else 1
    # a merge is checked in fp32, where an exact merge is measurable (and saved in its input's dtype)
    precision = resolve_precision(pipeline.stage_setting(name, "precision"), hardware) if trains else "fp32"
    arch = stage_architecture(pipeline, name) if trains else None
    targets = lora_targets(stage, f"stages.{name}", arch)
    rewards = reward_model_params(pipeline, name, arch) if arch else {}
    teacher = teacher_params(pipeline, name, arch) if arch else 0
    precompute_asked = bool(trains and trl_setting(stage.kind, stage.trl, "precompute_ref_log_probs"))
    template = resolve_template(value) if (value := pipeline.stage_chat_template(name)) else None
    return StageFacts(
        pipeline,
        name,
        hardware,
        stage,
        trains,
        workers,
        precision,
        arch,
        targets,
        rewards,
        teacher,
        precompute_asked,
        template,
    )
