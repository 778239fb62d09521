"""The pipeline file as typed data: one pydantic model per stage kind, unknown keys rejected, and the
one table of stage kinds (`KINDS`) that says what align needs to know about each.

Reading and validating a file is `align.pipeline.file.load()`. Nothing here loads a model or starts Ray.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    SerializeAsAny,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from align.config.data_settings import DataSpec
from align.config.eval_settings import EvalDataSpec, GenerationSpec, LmEvalSpec
from align.config.placement import ReferenceSpec
from align.config.reward import RewardSpec
from align.config.strict import Strict
from align.config.teacher import TeacherSpec
from align.errors import Problem

STAGE_NAME = r"^[A-Za-z_][A-Za-z0-9_-]*$"
VARIANT_NAME = r"^[A-Za-z_][A-Za-z0-9_-]*(\[[^\]]+\])?$"
"""A name, or a sweep's variant of one (`dpo[beta=0.1]`): what align names after a stage or eval model."""


class LoraSpec(Strict):
    """LoRA adapters on the stage's model; `load_in_4bit` makes it QLoRA (NF4 base)."""

    r: Annotated[int, Field(gt=0)] = 8
    alpha: Annotated[int, Field(gt=0)] | None = None
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.0
    target_modules: list[str] | Literal["all-linear"] = "all-linear"
    load_in_4bit: bool = False

    @field_validator("target_modules")
    @classmethod
    def names_something(cls, targets: list[str] | str) -> list[str] | str:
        """Names are checked against the model's own modules by the plan (a name the model lacks would fail
        in the worker minutes later); here only that there is one."""
        if not targets:
            raise ValueError("name at least one module, or 'all-linear'")
        return targets


class Zero2Spec(Strict):
    """DeepSpeed ZeRO-2 settings; `config` points at a user's own DeepSpeed JSON instead."""

    offload_optimizer: Literal["cpu", "none", "auto"] = "auto"
    overlap_comm: bool = True
    contiguous_gradients: bool = True
    bucket_size: Annotated[int, Field(gt=0, multiple_of=2)] = 50_000_000  # DeepSpeed needs it even
    config: str | None = None  # made absolute by align.pipeline.file, as every path of the file


class FSDPSpec(Strict):
    """FSDP2 full sharding settings."""

    cpu_offload: bool = False
    activation_checkpointing: bool = False
    reshard_after_forward: bool = True
    mixed_precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    prefetch: bool = True


class ResourcesSpec(Strict):
    """What each rank of a stage asks Ray for. A stage reserves one bundle per rank, all or nothing (a Ray
    placement group), and waits at most `wait_s` for it."""

    cpus_per_worker: Annotated[float, Field(gt=0)] | None = None
    """Default: this machine's cores shared by the ranks of a CPU stage on an embedded Ray; 1 on a cluster."""
    gpus_per_worker: Annotated[float, Field(ge=0)] | None = None  # default: 1 where GPUs exist, else 0
    custom: dict[str, Annotated[float, Field(gt=0)]] = {}  # Ray custom resources, e.g. {A100: 1}
    strategy: Literal["pack", "spread", "strict_pack", "strict_spread"] = "pack"
    wait_s: Annotated[float, Field(gt=0)] = 600.0


class StageBase(Strict):
    """What every stage kind shares: its input model, where it runs, and on how many workers."""

    model: str | None = None  # default: the pipeline's base_model
    backend: str | None = None  # auto or a registered backend (checked by align.pipeline.file)
    workers: Annotated[int, Field(gt=0)] | None = None
    precision: Literal["auto", "fp32", "bf16", "bf16-pure", "fp16"] | None = None
    save_dtype: Literal["input", "fp32", "bf16", "fp16"] = "input"
    """The dtype of the weights the stage writes: `input` is the input model's (a bf16 model stays bf16 after
    mixed-precision training in fp32), and keeps an adapter as trained."""
    zero2: Zero2Spec = Zero2Spec()
    fsdp: FSDPSpec = FSDPSpec()
    max_failures: Annotated[int, Field(ge=0)] | None = None
    checkpoint_minutes: Annotated[float, Field(gt=0)] | None = None
    chat_template: str | None = None  # over the pipeline's: a builtin (chatml), a .jinja file, a model folder
    resources: ResourcesSpec | None = Field(default=None, exclude=True)
    """Its keys over `defaults.resources`; where a stage runs does not change what it computes, so it is
    left out of the stage's fingerprint."""

    @model_serializer(mode="wrap")
    def without_unset_template(self, handler: Any) -> Any:
        """No `chat_template` key when none is set, so stages recorded before it existed stay up to date."""
        dumped = handler(self)
        if self.chat_template is None and isinstance(dumped, dict):
            dumped.pop("chat_template", None)
        return dumped


class TrainingStage(StageBase):
    """A stage that trains with a TRL trainer; `trl:` is passed through to its config class."""

    data: DataSpec
    lora: LoraSpec | None = None
    trl: dict[str, Any] = {}
    reference: ReferenceSpec | None = Field(default=None, exclude=True)  # where it runs: not fingerprinted
    samples: Annotated[int, Field(ge=0, le=64)] = 4
    """Held-out prompts answered greedily (24 tokens) before and after training, for the record and the
    report; 0: none. Their cost is in the record (`time_samples_before_s`, `time_samples_after_s`); the
    held-out measures' size is `data.max_eval_rows`."""


class SFTStage(TrainingStage):
    kind: Literal["sft"]


class DPOStage(TrainingStage):
    kind: Literal["dpo"]


class KTOStage(TrainingStage):
    """KTO on unpaired feedback (a completion labelled desirable or not); paired data is unpaired first."""

    kind: Literal["kto"]

    @field_validator("trl")
    @classmethod
    def batch_holds_a_kl_estimate(cls, trl: dict[str, Any]) -> dict[str, Any]:
        """KTO estimates its KL term from the other completions of each device's batch (all its losses but
        `apo_zero_unpaired`), so a batch of 1 cannot train; refused here, not minutes into the run."""
        batch = trl.get("per_device_train_batch_size")
        if str(batch).isdigit() and int(batch) < 2 and trl.get("loss_type") != "apo_zero_unpaired":
            raise ValueError(
                "per_device_train_batch_size must be at least 2: KTO estimates its KL term from the other "
                "completions of each device's batch; raise it, lowering gradient_accumulation_steps to keep "
                "the effective batch"
            )
        return trl


class RewardStage(TrainingStage):
    """A reward model: a one-label sequence-classification head trained on preference pairs."""

    kind: Literal["reward"]


class NoSignalSpec(Strict):
    """When an RL stage says it is learning nothing (align/stages/signal.py): `share` or more of its groups
    (PPO: rollouts) had identical rewards in each of the last `logs` logs."""

    share: Annotated[float, Field(gt=0, le=1)] = 0.9
    logs: Annotated[int, Field(gt=0)] = 3


class RewardedStage(TrainingStage):
    """Online RL on prompts: each reward is a function or a reward model, weighted."""

    rewards: Annotated[list[RewardSpec], Field(min_length=1)]
    no_signal: NoSignalSpec | None = Field(default=NoSignalSpec(), exclude=True)
    """When to say that the rewards give nothing to learn from (null: never); what is said changes nothing
    trained, so it is left out of the stage's fingerprint."""


class RLStage(RewardedStage):
    """GRPO or RLOO through TRL: advantages from a group of completions per prompt, no critic."""

    kind: Literal["grpo", "rloo"]


class PPOStage(RewardedStage):
    """PPO with a critic, align's own trainer. `value` says where the critic lives: a value head on the
    policy's own trunk (`head`), or its own LoRA adapter plus head on the shared frozen base (`adapter`)."""

    kind: Literal["ppo"]
    value: Literal["head", "adapter"] = "head"

    @field_validator("value")
    @classmethod
    def adapter_needs_lora(cls, value: str, info: ValidationInfo) -> str:
        if value == "adapter" and info.data.get("lora") is None:
            raise ValueError(
                "`adapter` gives the critic its own LoRA adapter on the policy's base, so the stage needs "
                "a `lora:` block; for full parameters use `value: head`"
            )
        if value == "adapter" and info.data.get("trl", {}).get("gradient_checkpointing"):
            raise ValueError(
                "the critic's adapter is switched on only for its own forward pass, and gradient "
                "checkpointing recomputes that pass in backward with the policy's adapter on, which gives "
                "the critic wrong gradients; use `value: head` or drop `trl.gradient_checkpointing`"
            )
        return value


class DistillStage(TrainingStage):
    """On-policy distillation with TRL's DistillationTrainer: the stage's model (the student) samples
    completions of its prompts and learns the teacher's next-token distribution on them (generalized JSD at
    `trl.beta`). The teacher must share the student's vocabulary (align/pipeline/teacher_checks.py)."""

    kind: Literal["distill"]
    teacher: TeacherSpec


class ReferenceFreeStage(TrainingStage):
    """Preference pairs with no reference model, through TRL's experimental trainers: ORPO (`kind: orpo`),
    and CPO or SimPO (`kind: cpo`; SimPO is `loss_type: simpo` with `cpo_alpha: 0`)."""

    kind: Literal["orpo", "cpo"]


class MergeStage(StageBase):
    """Merge the adapter(s) of `model` into their base and check the logits still match."""

    kind: Literal["merge"]
    check_prompts: list[str] = ["What is the capital of France?", "Tell me a joke.", "Hello, who are you?"]
    tolerance: Annotated[float, Field(gt=0)] = 1e-3
    """The largest logit difference allowed between the merged model and the adapter model, relative to the
    largest logit (per prompt). Summing in another order moves SmolLM2-135M's logits by about 3e-6 of it; a
    dropped or mis-scaled adapter by 1e-2. Above it the stage fails and publishes nothing."""
    max_kl: Annotated[float, Field(gt=0)] = 1e-5
    """The largest KL divergence allowed, at any position of the check prompts, from the adapter model's
    next-token distribution to the merged model's (a right merge of SmolLM2-135M gives about 1e-10, a dropped
    adapter 1e-3)."""
    min_greedy_agreement: Annotated[float, Field(ge=0, le=1)] = 0.95
    """The share of the check prompts' positions at which the merged model must pick the adapter model's
    greedy next token (below 1 so that float noise may flip a near tie)."""


class EvalStage(StageBase):
    """Trains nothing: asks each named model the same held-out prompts, scores the answers with `rewards:`
    (and lm-evaluation-harness tasks), and compares each model with the `baseline` (align/stages/eval.py)."""

    kind: Literal["eval"]
    models: Annotated[dict[str, str], Field(min_length=1)]  # name -> ${stages.X.output}, folder, builtin
    baseline: str | None = None  # default: the first of `models`
    data: EvalDataSpec | None = None
    rewards: list[RewardSpec] = []
    generation: GenerationSpec = GenerationSpec()
    lm_eval: LmEvalSpec | None = None

    @model_validator(mode="after")
    def comparable(self) -> EvalStage:
        if bad := [name for name in self.models if not re.fullmatch(VARIANT_NAME, name)]:
            raise ValueError(f"models: {bad[0]!r} is not a name (letters, digits, _ and -)")
        if self.model is not None:
            raise ValueError("an eval stage names the models it compares under `models:`, not `model:`")
        if self.baseline is not None and self.baseline not in self.models:
            raise ValueError(f"baseline {self.baseline!r} is not one of models: {', '.join(self.models)}")
        if self.rewards and self.data is None:
            raise ValueError("rewards score answers to prompts: give `data: {prompts: FILE}`")
        if self.data is not None and not self.rewards:
            raise ValueError("give `rewards:` to score the answers to data.prompts (exact_answer, ...)")
        if self.data is None and self.lm_eval is None:
            raise ValueError("give prompts and rewards (`data:`, `rewards:`), or `lm_eval:` tasks, or both")
        return self

    @property
    def baseline_name(self) -> str:
        return self.baseline or next(iter(self.models))


@dataclass(frozen=True)
class StageKind:
    """One row of the stage-kind table: everything align needs to know about a kind, in one place.

    config: TRL's config class as `module.Class` (imported only where it is built); None takes no `trl:`.
    data: the data kind its `data:` must be (`align.data.loading.DATA_COLUMNS`); None: a stage without data.
    reference: `never`, `always`, or `with_kl` (only when the config's `beta` > 0).
    sequences: sequences per example in one forward (a preference pair is 2), for the memory plan.
    runner: the module whose `run(StageContext)` runs it, imported in the worker.
    """

    spec: type[StageBase]
    config: str | None
    data: str | None
    reference: Literal["never", "always", "with_kl"]
    sequences: int
    runner: str

    @property
    def trains(self) -> bool:
        return issubclass(self.spec, TrainingStage)

    @property
    def ranked(self) -> bool:
        """Runs on `workers` ranks: a training stage, or an eval stage (its prompts sharded over them)."""
        return self.trains or issubclass(self.spec, EvalStage)


KINDS: dict[str, StageKind] = {
    "sft": StageKind(SFTStage, "trl.SFTConfig", "sft", "never", 1, "align.stages.sft"),
    "dpo": StageKind(DPOStage, "trl.DPOConfig", "preferences", "always", 2, "align.stages.dpo"),
    "kto": StageKind(KTOStage, "trl.KTOConfig", "unpaired", "always", 2, "align.stages.kto"),
    "reward": StageKind(RewardStage, "trl.RewardConfig", "preferences", "never", 2, "align.stages.reward"),
    "grpo": StageKind(RLStage, "trl.GRPOConfig", "prompts", "with_kl", 1, "align.stages.grpo"),
    "rloo": StageKind(RLStage, "trl.RLOOConfig", "prompts", "with_kl", 1, "align.stages.grpo"),
    "ppo": StageKind(
        PPOStage, "align.trainers.ppo_config.PPOConfig", "prompts", "always", 1, "align.stages.ppo"
    ),
    "distill": StageKind(
        DistillStage, "trl.DistillationConfig", "prompts", "never", 1, "align.stages.distill"
    ),
    "orpo": StageKind(
        ReferenceFreeStage, "trl.experimental.orpo.ORPOConfig", "preferences", "never", 2, "align.stages.orpo"
    ),
    "cpo": StageKind(
        ReferenceFreeStage, "trl.experimental.cpo.CPOConfig", "preferences", "never", 2, "align.stages.orpo"
    ),
    "merge": StageKind(MergeStage, None, None, "never", 1, "align.stages.merge"),
    "eval": StageKind(EvalStage, None, "prompts", "never", 1, "align.stages.eval"),
}
"""KTO's 2 sequences: each completion and the mismatched completion of its KL estimate."""
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
"""ORPO and CPO are TRL's experimental trainers, named knowingly by their kinds (docs/stages/orpo.md says
so); TRL's notice on importing them would repeat on every validate and in every worker."""


class Defaults(Strict):
    """Pipeline-wide settings that a stage may override."""

    backend: str = "auto"  # or a registered backend (checked by align.pipeline.file)
    workers: Annotated[int, Field(gt=0)] = 1
    precision: Literal["auto", "fp32", "bf16", "bf16-pure", "fp16"] = "auto"  # align/models/precision.py
    output_root: str = "runs"
    seed: int = 0
    device_memory: str | None = None  # e.g. "80GB"; detected when absent
    max_failures: Annotated[int, Field(ge=0)] = 2  # lost workers retried from the latest checkpoint
    checkpoint_minutes: Annotated[float, Field(gt=0)] = 30.0  # a checkpoint at least this often
    resources: ResourcesSpec = ResourcesSpec()


class Pipeline(Strict):
    """A whole pipeline file, validated; stages keep the order they were written in."""

    name: Annotated[str, Field(pattern=STAGE_NAME)]
    base_model: str
    allow_custom_code: bool = False
    chat_template: str | None = None  # for a base model without one (align/models/chat_templates.py)
    defaults: Defaults = Defaults()
    stages: dict[str, SerializeAsAny[StageBase]]
    edges: dict[str, list[str]] = Field(default_factory=dict, exclude=True)
    """Each stage's upstream stages, from its `${stages.X.output}` references: set by the file's checks."""
    source_dir: str | None = Field(default=None, exclude=True)
    """The pipeline file's folder: its relative paths were read from there (align.pipeline.file)."""
    sweep: Any = Field(default=None, exclude=True)
    """The file's `sweep:` validated, with what expanding it needs (align.pipeline.sweep.Sweep), or None."""
    warnings: tuple[Problem, ...] = Field(default=(), exclude=True)
    """Values legal but almost surely a mistake (a learning rate above 1): said in a line each, not refused"""
    absent: tuple[Problem, ...] = Field(default=(), exclude=True)
    """Hub models this machine cannot load (the hub off and the id not in its cache): `validate` and `plan`
    say so, `align data` and a run on this machine refuse them before anything starts."""

    def stage_model(self, name: str) -> str:
        """The model a stage starts from: its own `model:` or the pipeline's base model."""
        return self.stages[name].model or self.base_model

    def module_roots(self) -> list[str]:
        """Where a reward function of the user's own imports from: the directory `align` runs in, then the
        pipeline file's folder. Validate imports it from there, and the workers need them on PYTHONPATH."""
        return list(dict.fromkeys(filter(None, [os.getcwd(), self.source_dir])))

    def stage_chat_template(self, name: str) -> str | None:
        """The chat template a stage applies: its own, else the pipeline's (None: the model's own)."""
        return self.stages[name].chat_template or self.chat_template

    def stage_resources(self, name: str) -> ResourcesSpec:
        """`defaults.resources` with the keys the stage's own `resources:` sets."""
        own = self.stages[name].resources
        if own is None:
            return self.defaults.resources
        return self.defaults.resources.model_copy(
            update={key: getattr(own, key) for key in own.model_fields_set}
        )

    def stage_setting(self, name: str, key: str) -> Any:
        """A stage's own value for a setting it shares with `defaults`, else the pipeline default."""
        value = getattr(self.stages[name], key)
        return getattr(self.defaults, key) if value is None else value
