"""Pipeline -> Plan: the one place where every decision about a stage is made, before anything loads.

Per stage: the backend (auto resolved among those that can run it, each priced as it would run), the
optimizer offload, precision, device kind, data kind, where each model lives, and the memory per rank.
`align plan` prints it. Once `build` returns, a StagePlan is never changed: what the controller adds when
it starts a stage (its resolved input folders, pinned data, its share of the cores, the memory priced at
launch) is a `Launch` beside it (align/planning/launch.py). Backends and runners read both and decide
nothing again. Nothing downstream re-reads the YAML.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from align.backends import BACKENDS, Backend
from align.config.data_settings import DataSpec
from align.config.eval_settings import EvalDataSpec
from align.config.reward import RewardSpec
from align.config.spec import KINDS, LoraSpec, Pipeline, StageBase
from align.config.stage_parts import data_of, eval_models_of, lora_of, rewards_of, teacher_of, trl_of
from align.config.teacher import TeacherSpec
from align.data.batching import sft_batching
from align.errors import ConfigError
from align.models.architectures import LoraTargets
from align.models.chat_templates import ChatTemplate
from align.models.memory import USABLE_FRACTION, MemoryEstimate, describe_workload, format_bytes
from align.models.precision import compute_dtype, precision_problems, trainable_dtype
from align.pipeline.graph import order, references
from align.planning.hardware import Hardware
from align.planning.host import host_problems
from align.planning.inputs import ModelInput as ModelInput  # read from here by stages and run
from align.planning.inputs import StageInputs as StageInputs
from align.planning.lora import LMHead, lm_head, trained_rows
from align.planning.losses import loss_words
from align.planning.model_sizes import root_model as root_model  # read from here by report/rows_view.py
from align.planning.placement import (
    Placement,
    plan_placement,
    with_services,
)
from align.planning.resources import Request, stage_request
from align.planning.services import stage_services
from align.planning.stage_facts import StageFacts, stage_facts
from align.planning.workload import PROMPT_TOKENS as PROMPT_TOKENS  # read from here by tests
from align.planning.workload import micro_batch, sequence_length, workload

ZERO2_MAX_PARAMS = 13_000_000_000
"""ZeRO-2 replicates the weights on every rank; from 13B up `auto` prefers full sharding."""


@dataclass(frozen=True)
class StagePlan:
    """Everything a worker needs to run one stage, as decided before anything loads."""

    name: str
    kind: str
    stage: StageBase
    model_source: str
    upstream: tuple[str, ...]
    backend: str
    backend_reason: str
    workers: int
    precision: str
    trainable_dtype: str  # what the trained parameters are held in (align/models/precision.py)
    seed: int
    accelerator: bool
    offload_optimizer: bool
    data_kind: str | None
    placement: Placement
    memory: MemoryEstimate | None = None
    memory_by_backend: dict[str, MemoryEstimate] = field(default_factory=dict)
    max_failures: int = 2  # lost workers retried, each time from the latest checkpoint
    remote_code: bool = False  # the pipeline's `allow_custom_code`: models may run their own code
    checkpoint_minutes: float = 30.0
    batching: tuple[str, str] | None = None  # an SFT stage's (how it batches, why): align/data/batching.py
    lora_targets: LoraTargets | None = None  # `lora.target_modules` resolved against the model's modules
    resources: Request | None = None  # what each rank asks Ray for (align/planning/resources.py)
    chat_template: ChatTemplate | None = None  # applied to the stage's tokenizer (models/chat_templates.py)
    lm_head: LMHead | None = None  # how TRL's trainer reads the head (align/planning/lora.py)
    loss: str | None = None  # the loss its `trl:` block picks, in words (align/planning/losses.py)

    @property
    def where(self) -> str:
        """The stage's YAML path, in front of every message about it."""
        return f"stages.{self.name}"

    @property
    def lora(self) -> LoraSpec | None:
        """Its `lora:` block, read from the kind that has one (align/config/stage_parts.py)."""
        return lora_of(self.stage)

    @property
    def trl(self) -> dict[str, Any]:
        return trl_of(self.stage)

    @property
    def data(self) -> DataSpec | EvalDataSpec | None:
        return data_of(self.stage)

    @property
    def rewards(self) -> list[RewardSpec]:
        return rewards_of(self.stage)

    @property
    def teacher(self) -> TeacherSpec | None:
        return teacher_of(self.stage)

    @property
    def eval_models(self) -> dict[str, str]:
        return eval_models_of(self.stage)

    @property
    def process_group(self) -> bool:
        """Whether its ranks join a process group, as its backend says (one DDP rank runs without)."""
        return BACKENDS[self.backend].needs_process_group(self.workers)


@dataclass(frozen=True)
class Plan:
    pipeline: Pipeline
    order: tuple[str, ...]
    edges: dict[str, list[str]]
    stages: dict[str, StagePlan]
    hardware: Hardware


def auto_order(lora: bool, workers: int) -> tuple[str, ...]:
    """The backends `auto` tries, best first: for LoRA/QLoRA ZeRO-2 (small adapter states), then FSDP
    (the base sharded too, where no replica fits); DDP on one rank; ZeRO-2 then FSDP for full parameters."""
    if lora:
        return ("zero2", "fsdp", "ddp")
    return ("ddp", "zero2") if workers == 1 else ("zero2", "fsdp")


def choose_backend(
    stage: StageBase,
    where: str,
    workers: int,
    precision: str,
    hardware: Hardware,
    price: Callable[[Backend], MemoryEstimate | None],
    what: str,
) -> tuple[str, str]:
    """The backend for `backend: auto` and why, in one line naming the numbers.

    Only backends that accept the stage (`problems` empty) are offered; each is priced by `price` with
    the settings it will run with. The first that fits wins (ZeRO-2 for full parameters only under 13B:
    it copies every weight to each rank); when none fits, the smallest, with how far over it is.
    """
    if workers == 1 and not hardware.accelerator:
        return (
            "ddp",
            "one CPU rank: nothing to shard, and offloading to the host it already runs on gains nothing",
        )
    lora = lora_of(stage) is not None
    offered = [BACKENDS[name] for name in auto_order(lora, workers)]
    offered = [backend for backend in offered if not backend.problems(stage, where, workers, precision)]
    if not offered:
        return "ddp", "no sharded backend accepts this stage"
    priced = [(backend, price(backend)) for backend in offered]
    if any(estimate is None for _, estimate in priced):
        first = offered[0]
        return (
            first.name,
            f"{what}: {first.titles[first.option(stage)]} (architecture unknown, no memory plan)",
        )
    usable = int(hardware.device_memory * USABLE_FRACTION)
    budget = (
        f"{format_bytes(usable)} usable ({USABLE_FRACTION:.0%} of {format_bytes(hardware.device_memory)})"
    )
    on = "" if lora else f" on {workers} rank{'s' if workers > 1 else ''}"
    rejected = []
    for backend, estimate in priced:
        needs = f"{backend.titles[backend.option(stage)]} needs {format_bytes(estimate.total)}/rank"
        copies_all = backend.name == "zero2" and not lora and estimate.trainable_params >= ZERO2_MAX_PARAMS
        if estimate.total <= usable and not copies_all:
            return backend.name, f"{what}{on}: " + "; ".join([*rejected, f"{needs} <= {budget}"])
        if copies_all and estimate.total <= usable:
            title, weights = backend.titles[backend.option(stage)], format_bytes(estimate.device.params)
            fits = f"{title} fits ({format_bytes(estimate.total)}/rank)"
            needs = f"{fits} but copies all {weights} of weights to each rank"
        rejected.append(needs)
    backend, smallest = min(priced, key=lambda pair: pair[1].total)
    over = format_bytes(smallest.total - usable)
    return backend.name, f"{what}{on} does not fit: {'; '.join(rejected)}, {over} over {budget}"


def price(facts: StageFacts, backend: Backend, placement: Placement) -> dict[str, MemoryEstimate]:
    """Every column of the backend's memory table for this stage (empty without an architecture)."""
    if facts.arch is None:
        return {}
    rows = trained_rows(facts.stage, facts.template, backend.frozen_sharded, facts.arch)
    work = workload(facts.stage, facts.precision, placement, facts.arch, facts.rewards, rows, facts.teacher)
    return backend.estimates(facts.arch, work, facts.workers, facts.stage)


def price_table(facts: StageFacts, placement: Placement) -> dict[str, MemoryEstimate]:
    """Every backend's columns, each holding the models as `placement` does, so rows line up."""
    return {option: est for one in BACKENDS.values() for option, est in price(facts, one, placement).items()}


def requested_backend(facts: StageFacts) -> tuple[str, str]:
    """The backend and why: one the kind fixes, the one the file names, or `auto`'s choice among those
    that accept the stage, each priced as it would run."""
    stage, arch = facts.stage, facts.arch
    requested = facts.pipeline.stage_setting(facts.name, "backend")
    if stage.kind == "eval":
        return "ddp", "an eval trains nothing: each rank holds whole models, the prompts sharded"
    if not facts.trains:  # a `defaults.backend` is for the training stages
        return "ddp", f"a {stage.kind} runs in one process"
    if requested != "auto":
        return requested, "named in the pipeline file"
    if arch:
        ddp = plan_placement(stage, BACKENDS["ddp"])
        what = describe_workload(
            arch, workload(stage, facts.precision, ddp, arch, facts.rewards, teacher=facts.teacher)
        )
    else:
        what = "LoRA" if lora_of(stage) else "full parameters"

    def as_it_would_run(backend: Backend) -> MemoryEstimate | None:
        placement = plan_placement(stage, backend, precompute=facts.precompute_asked)
        return price(facts, backend, placement).get(backend.option(stage))

    hardware = facts.hardware
    return choose_backend(stage, facts.where, facts.workers, facts.precision, hardware, as_it_would_run, what)


def placed(facts: StageFacts, backend: Backend) -> tuple[Placement, dict[str, MemoryEstimate]]:
    """Where each model lives, and every backend's memory so: as asked, unless a reference copy is what does
    not fit, and its log-probs computed before training do."""
    stage, usable = facts.stage, facts.hardware.device_memory * USABLE_FRACTION
    placement = plan_placement(stage, backend, precompute=facts.precompute_asked)
    by_backend = price_table(facts, placement)
    option = backend.option(stage)
    lean = plan_placement(stage, backend, precompute=True)
    too_big = by_backend and by_backend[option].total > usable
    if lean.reference != placement.reference and too_big:
        lean_table = price_table(facts, lean)
        if lean_table[option].total <= usable:
            return lean, lean_table  # the copy is what does not fit: precompute instead
    return placement, by_backend


def plan_stage(pipeline: Pipeline, name: str, upstream: list[str], hardware: Hardware) -> StagePlan:
    """Every decision for one stage, in order: its facts, backend, refusals, placement and memory, head and
    services. Raises ConfigError naming what the chosen backend cannot run."""
    facts = stage_facts(pipeline, name, hardware)
    stage, trains, precision, arch = facts.stage, facts.trains, facts.precision, facts.arch
    requested, reason = requested_backend(facts)
    backend = BACKENDS[requested]
    if trains and (problems := precision_problems(stage, facts.where, precision)):
        raise ConfigError(problems)
    if trains and (problems := backend.problems(stage, facts.where, facts.workers, precision)):
        raise ConfigError(problems)
    placement, by_backend = placed(facts, backend)
    policy_params = arch.param_count() if arch else 0
    positions = micro_batch(stage) * sequence_length(stage) if trains else 0
    head = lm_head(stage, facts.template, arch, backend.frozen_sharded, positions) if trains else None
    compute = compute_dtype(precision)
    services = stage_services(stage, hardware.accelerator, policy_params, facts.rewards, compute)
    return StagePlan(
        name=name,
        kind=stage.kind,
        stage=stage,
        model_source=pipeline.stage_model(name),
        upstream=tuple(upstream),
        backend=requested,
        backend_reason=reason,
        workers=facts.workers,
        precision=precision,
        trainable_dtype=trainable_dtype(precision, backend.keeps_fp32_master),
        seed=pipeline.defaults.seed,
        accelerator=hardware.accelerator,
        offload_optimizer=backend.offloads_optimizer(stage),
        data_kind=KINDS[stage.kind].data,
        placement=with_services(placement, services),
        memory=by_backend.get(backend.option(stage)),
        memory_by_backend=by_backend,
        max_failures=pipeline.stage_setting(name, "max_failures"),
        checkpoint_minutes=pipeline.stage_setting(name, "checkpoint_minutes"),
        remote_code=pipeline.allow_custom_code,
        batching=sft_batching(stage.trl) if stage.kind == "sft" else None,
        lora_targets=facts.targets,
        resources=stage_request(pipeline, name, facts.workers, hardware.accelerator),
        chat_template=facts.template,
        lm_head=head,
        loss=loss_words(stage) if trains else None,
    )


def build(pipeline: Pipeline, hardware: Hardware | None = None) -> Plan:
    """The plan for every stage, in dependency order; every refusal of every stage at once, with what the
    host could never hold when the ranks run on this machine (`hardware.host`)."""
    hardware = hardware or Hardware.detect(pipeline.defaults.device_memory)
    edges = pipeline.edges or references(pipeline.stages)[0]  # a Pipeline built in code has none yet
    names, _ = order(edges)
    stages, problems = {}, []
    for name in names:
        try:
            stages[name] = plan_stage(pipeline, name, edges[name], hardware)
        except ConfigError as err:
            problems += err.problems
    problems += [problem for stage in stages.values() for problem in host_problems(stage, hardware)]
    if problems:
        raise ConfigError(problems)
    stages = started_together(stages)
    return Plan(pipeline=pipeline, order=tuple(names), edges=edges, stages=stages, hardware=hardware)


def started_together(stages: dict[str, StagePlan]) -> dict[str, StagePlan]:
    """Each stage told how many stages a full run starts with it (those that read the same stages are ready
    at one moment; the first stages all at once), so that `align plan` says its share of an embedded Ray's
    cores. The run counts them again as it starts them (align/run/controller.py): skipped ones drop out."""
    together = Counter(frozenset(stage.upstream) for stage in stages.values())
    with_count = {name: together[frozenset(stage.upstream)] for name, stage in stages.items()}
    return {
        name: replace(stage, resources=replace(stage.resources, alongside=with_count[name]))
        for name, stage in stages.items()
    }
