"""Pipeline -> Plan: per stage, the backend (auto resolved), world size, placement and memory per rank.

The plan is plain data: `align plan` prints it, the controller ships each StagePlan to its workers,
and nothing downstream re-reads the YAML.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from align.architectures import Architecture, architecture_for
from align.cache import cache_root
from align.errors import AlignError, ConfigError
from align.graph import order, reference_target, references
from align.memory import USABLE_FRACTION, MemoryEstimate, Workload, choose_backend, estimate, parse_memory
from align.placement import VALUE_ADAPTER, VALUE_NONE, Placement, frozen_models, plan_placement
from align.spec import Pipeline, RewardedStage, Stage, TrainingStage
from align.trl_args import trl_setting

DEFAULT_DEVICE_MEMORY = "80GB"
PROMPT_TOKENS = 512
"""The prompt length the plan assumes for online RL (ppo, grpo, rloo): none of their configs caps a
prompt, so a trained sequence is this plus `max_completion_length`. An assumption, not a limit."""


@dataclass(frozen=True)
class Hardware:
    """What the stages will run on: accelerator or not, and memory per device."""

    accelerator: bool
    device_memory: int
    bf16: bool = False

    @classmethod
    def detect(cls, device_memory: str | None = None, *, planning: bool = False) -> Hardware:
        """The local machine, with `--device-memory` overriding what is detected.

        When only planning, a device memory given on a machine without GPUs means "plan for GPUs
        of this size" (bf16), so a CPU laptop can plan the 8B run it will submit elsewhere.
        """
        import torch

        real_gpu = torch.cuda.is_available()
        if device_memory is None:
            memory = torch.cuda.get_device_properties(0).total_memory if real_gpu else None
        else:
            try:
                memory = parse_memory(device_memory)
            except ValueError as err:
                raise AlignError(f"device memory: {err}") from None
        gpu = real_gpu or (planning and device_memory is not None)
        bf16 = gpu and (not real_gpu or torch.cuda.is_bf16_supported())
        return cls(accelerator=gpu, device_memory=memory or parse_memory(DEFAULT_DEVICE_MEMORY), bf16=bf16)


@dataclass(frozen=True)
class StagePlan:
    """Everything a worker needs to run one stage, as decided before anything loads."""

    name: str
    kind: str
    stage: Stage
    model_source: str
    upstream: tuple[str, ...]
    backend: str
    backend_reason: str
    workers: int
    precision: str
    seed: int
    placement: Placement
    memory: MemoryEstimate | None = None
    memory_by_backend: dict[str, MemoryEstimate] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    pipeline: Pipeline
    order: tuple[str, ...]
    edges: dict[str, list[str]]
    stages: dict[str, StagePlan]
    hardware: Hardware


def root_model(pipeline: Pipeline, name: str) -> str:
    """The base model at the root of a chain of stage references (its architecture is the stage's)."""
    value = pipeline.stage_model(name)
    target = reference_target(value)
    return root_model(pipeline, target) if target else value


def stage_architecture(pipeline: Pipeline, name: str) -> Architecture | None:
    """The architecture of a stage's model from its config or a preset; a builtin once it is cached."""
    return model_architecture(root_model(pipeline, name))


def model_architecture(source: str) -> Architecture | None:
    """The architecture of a model folder or hub id from its config or a preset; a builtin once cached."""
    cached = cache_root() / "models" / source
    return architecture_for(str(cached) if cached.is_dir() else source)


def reward_model_params(pipeline: Pipeline, name: str, policy: Architecture) -> dict[int, int]:
    """Each reward model's parameter count, by its index in the stage's `rewards:`.

    A reward stage's output is its root model's trunk with a one-label score head; a folder or hub id
    counts by its config.json or a preset. One whose shape is unknown before it is present (a hub id
    without a preset) is assumed to share the policy's trunk.
    """
    stage = pipeline.stages[name]
    if not isinstance(stage, RewardedStage):
        return {}
    counts = {}
    for index, reward in enumerate(stage.rewards):
        if reward.model is not None:
            target = reference_target(reward.model)
            shape = stage_architecture(pipeline, target) if target else model_architecture(reward.model)
            counts[index] = (shape or policy).reward_model_param_count()
    return counts


def resolve_precision(requested: str, hardware: Hardware) -> str:
    """`auto` is bf16 where the accelerator has it, else fp32 (CPUs train in fp32 here)."""
    if requested != "auto":
        return requested
    return "bf16" if hardware.bf16 else "fp32"


def workload(
    stage: Stage,
    precision: str,
    placement: Placement,
    arch: Architecture,
    reward_params: dict[int, int] | None = None,
) -> Workload:
    """What the memory plan counts for a stage; `reward_params` as `reward_model_params` gives them.

    A PPO critic trains beside the policy: its head, and under `value: adapter` a second LoRA adapter
    whose forward through the shared trunk is kept for backward too. Rollouts (generation, and the
    no-grad forwards of reference, reward models and critic) are transient and not counted.
    """
    lora = stage.lora if isinstance(stage, TrainingStage) else None
    trl = stage.trl if isinstance(stage, TrainingStage) else {}
    pair = 2 if stage.kind == "dpo" else 1
    targets = tuple(lora.target_modules) if lora and isinstance(lora.target_modules, list) else "all-linear"
    critic = 0
    if placement.value != VALUE_NONE:
        critic = arch.hidden_size + 1  # the value head, hidden -> 1 with a bias
    if placement.value == VALUE_ADAPTER:
        critic += arch.lora_param_count(lora.r, targets)
    return Workload(
        dtype="bf16" if precision == "fp32" and lora and lora.load_in_4bit else precision,
        lora_rank=lora.r if lora else None,
        lora_targets=targets,
        quantize_4bit=bool(lora and lora.load_in_4bit),
        frozen_models=frozen_models(placement, arch.param_count(), precision, reward_params),
        micro_batch_size=int(trl.get("per_device_train_batch_size", 8)) * pair,
        seq_len=sequence_length(stage),
        gradient_checkpointing=bool(trl.get("activation_checkpointing") or trl.get("gradient_checkpointing")),
        extra_trainable=critic,
        trunk_passes=2 if placement.value == VALUE_ADAPTER else 1,
    )


def sequence_length(stage: Stage) -> int:
    """Tokens per trained sequence: `max_length`, or for online RL a prompt plus its completion."""
    trl = stage.trl if isinstance(stage, TrainingStage) else {}
    if isinstance(stage, RewardedStage):
        return PROMPT_TOKENS + int(trl_setting(stage.kind, trl, "max_completion_length"))
    return int(trl.get("max_length", 1024) or 1024)


def choose(
    stage: Stage,
    requested: str,
    workers: int,
    arch: Architecture | None,
    hardware: Hardware,
    work: Workload | None,
) -> tuple[str, str]:
    """The backend for a stage and why, in one line."""
    if requested != "auto":
        return requested, "named in the pipeline file"
    if stage.kind == "merge":
        return "ddp", "a merge runs in one process"
    if workers == 1 and not hardware.accelerator:
        return (
            "ddp",
            "one CPU rank: nothing to shard, and offloading to the host it already runs on gains nothing",
        )
    if arch is None or work is None:
        lora = isinstance(stage, TrainingStage) and stage.lora is not None
        return (
            ("zero2", "LoRA: ZeRO-2 (architecture unknown, no memory plan)")
            if lora
            else ("fsdp", "full parameters: FSDP (architecture unknown, no memory plan)")
        )
    return choose_backend(arch, work, world_size=workers, device_memory=hardware.device_memory)


def plan_stage(pipeline: Pipeline, name: str, upstream: list[str], hardware: Hardware) -> StagePlan:
    stage = pipeline.stages[name]
    workers = 1 if stage.kind == "merge" else pipeline.stage_setting(name, "workers")
    # a merge is checked and saved in fp32, where an exact merge is measurable
    precision = (
        "fp32"
        if stage.kind == "merge"
        else resolve_precision(pipeline.stage_setting(name, "precision"), hardware)
    )
    arch = stage_architecture(pipeline, name)
    trains = isinstance(stage, TrainingStage)
    rewards = reward_model_params(pipeline, name, arch) if arch else {}
    draft = plan_placement(stage, "ddp")
    work = workload(stage, precision, draft, arch, rewards) if arch and trains else None
    backend, reason = choose(stage, pipeline.stage_setting(name, "backend"), workers, arch, hardware, work)
    chosen = "zero2+offload" if backend == "zero2" and offloads_optimizer(stage, backend) else backend
    asked = bool(trains and stage.trl.get("precompute_ref_log_probs"))
    placement = plan_placement(stage, backend, precompute=asked)
    by_backend = (
        memory_options(stage, arch, placement, precision, workers, rewards) if arch and trains else {}
    )
    usable = hardware.device_memory * USABLE_FRACTION
    lean = plan_placement(stage, backend, precompute=True)
    if lean.reference != placement.reference and by_backend and by_backend[chosen].total > usable:
        lean_memory = memory_options(stage, arch, lean, precision, workers, rewards)
        if lean_memory[chosen].total <= usable:  # the copy is what does not fit: precompute instead
            placement, by_backend = lean, lean_memory
    return StagePlan(
        name=name,
        kind=stage.kind,
        stage=stage,
        model_source=pipeline.stage_model(name),
        upstream=tuple(upstream),
        backend=backend,
        backend_reason=reason,
        workers=workers,
        precision=precision,
        seed=pipeline.defaults.seed,
        placement=placement,
        memory=by_backend.get(chosen),
        memory_by_backend=by_backend,
    )


def memory_options(
    stage: Stage,
    arch: Architecture,
    placement: Placement,
    precision: str,
    workers: int,
    reward_params: dict[int, int] | None = None,
) -> dict[str, MemoryEstimate]:
    """The stage's per-rank memory under each backend option, for the given model placement."""
    work = workload(stage, precision, placement, arch, reward_params)
    return {
        option: estimate(
            arch,
            work,
            backend=option.split("+")[0],
            world_size=workers,
            offload_optimizer=offload,
            offload_params=option == "fsdp" and stage.fsdp.cpu_offload,
        )
        for option, offload in (("ddp", False), ("zero2", False), ("zero2+offload", True), ("fsdp", False))
    }


def offloads_optimizer(stage: Stage, backend: str) -> bool:
    """ZeRO-2 offloads the optimizer to CPU when asked, and by default for LoRA/QLoRA."""
    if backend != "zero2":
        return False
    setting = stage.zero2.offload_optimizer
    return setting == "cpu" or (
        setting == "auto" and isinstance(stage, TrainingStage) and stage.lora is not None
    )


def check_backends(stages: dict[str, StagePlan]) -> None:
    """Refuse, before Ray starts, what a chosen backend cannot do (each backend says what that is)."""
    from align.backends import backend_for

    problems = []
    for stage in stages.values():
        if isinstance(stage.stage, TrainingStage):
            try:
                backend_for(stage.backend).check_supported(stage)
            except ConfigError as err:
                problems += err.problems
    if problems:
        raise ConfigError(problems)


def build(pipeline: Pipeline, hardware: Hardware | None = None) -> Plan:
    """The plan for every stage, in dependency order."""
    hardware = hardware or Hardware.detect(pipeline.defaults.device_memory)
    edges, _ = references(pipeline.stages)
    names, _ = order(edges)
    stages = {name: plan_stage(pipeline, name, edges[name], hardware) for name in names}
    check_backends(stages)
    return Plan(pipeline=pipeline, order=tuple(names), edges=edges, stages=stages, hardware=hardware)
