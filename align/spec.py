"""The pipeline file as typed data: one pydantic model per stage kind, unknown keys rejected.

`load()` reads YAML with `safe_load`, applies `--set` overrides, validates every stage and its
`trl:` block, cross-checks references and data, and raises one `ConfigError` listing every
problem with its YAML path. Nothing here loads a model or starts Ray.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from align.cache import user_path
from align.errors import ConfigError, Problem
from align.rewards import RewardSpec
from align.validation import pydantic_problems

BACKEND_NAMES = ("auto", "ddp", "zero2", "fsdp")
STAGE_NAME = r"^[A-Za-z_][A-Za-z0-9_-]*$"


class Strict(BaseModel):
    """Base for every block of the pipeline file: unknown keys are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class LoraSpec(Strict):
    """LoRA adapters on the stage's model; `load_in_4bit` makes it QLoRA (NF4 base)."""

    r: Annotated[int, Field(gt=0)] = 8
    alpha: Annotated[int, Field(gt=0)] | None = None
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.0
    target_modules: list[str] | Literal["all-linear"] = "all-linear"
    load_in_4bit: bool = False


class DataSpec(Strict):
    """A stage's data: a builtin (`align:...`), a jsonl/parquet file, or a `datasets` folder."""

    train: str
    eval: str | None = None
    max_train_rows: Annotated[int, Field(gt=0)] | None = None
    max_eval_rows: Annotated[int, Field(gt=0)] | None = None


class Zero2Spec(Strict):
    """DeepSpeed ZeRO-2 settings; `config` points at a user's own DeepSpeed JSON instead."""

    offload_optimizer: Literal["cpu", "none", "auto"] = "auto"
    overlap_comm: bool = True
    contiguous_gradients: bool = True
    bucket_size: Annotated[int, Field(gt=0, multiple_of=2)] = 50_000_000  # DeepSpeed needs it even
    config: str | None = None

    @field_validator("config")
    @classmethod
    def absolute_config(cls, value: str | None) -> str | None:
        """Resolved against the directory align runs in: Ray workers run elsewhere."""
        return str(user_path(value).resolve()) if value else value


class FSDPSpec(Strict):
    """FSDP2 full sharding settings."""

    cpu_offload: bool = False
    activation_checkpointing: bool = False
    reshard_after_forward: bool = True
    mixed_precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    prefetch: bool = True


class StageBase(Strict):
    """What every stage kind shares: its input model, where it runs, and on how many workers."""

    model: str | None = None  # default: the pipeline's base_model
    backend: Literal["auto", "ddp", "zero2", "fsdp"] | None = None
    workers: Annotated[int, Field(gt=0)] | None = None
    precision: Literal["auto", "fp32", "bf16", "fp16"] | None = None
    zero2: Zero2Spec = Zero2Spec()
    fsdp: FSDPSpec = FSDPSpec()


class TrainingStage(StageBase):
    """A stage that trains with a TRL trainer; `trl:` is passed through to its config class."""

    data: DataSpec
    lora: LoraSpec | None = None
    trl: dict[str, Any] = {}


class SFTStage(TrainingStage):
    kind: Literal["sft"]


class DPOStage(TrainingStage):
    kind: Literal["dpo"]


class RewardStage(TrainingStage):
    """A reward model: a one-label sequence-classification head trained on preference pairs."""

    kind: Literal["reward"]


class RewardedStage(TrainingStage):
    """Online RL on prompts: each reward is a function or a reward model, weighted."""

    rewards: Annotated[list[RewardSpec], Field(min_length=1)]


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


class MergeStage(StageBase):
    """Merge the adapter(s) of `model` into their base and check the logits still match."""

    kind: Literal["merge"]
    check_prompts: list[str] = ["What is the capital of France?", "Tell me a joke.", "Hello, who are you?"]
    tolerance: Annotated[float, Field(gt=0)] = 1e-4


STAGE_KINDS: dict[str, type[StageBase]] = {
    "sft": SFTStage,
    "dpo": DPOStage,
    "reward": RewardStage,
    "grpo": RLStage,
    "rloo": RLStage,
    "ppo": PPOStage,
    "merge": MergeStage,
}
Stage = SFTStage | DPOStage | RewardStage | RLStage | PPOStage | MergeStage


class Defaults(Strict):
    """Pipeline-wide settings that a stage may override."""

    backend: Literal["auto", "ddp", "zero2", "fsdp"] = "auto"
    workers: Annotated[int, Field(gt=0)] = 1
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    output_root: str = "runs"
    seed: int = 0
    device_memory: str | None = None  # e.g. "80GB"; detected when absent


class Pipeline(Strict):
    """A whole pipeline file, validated; stages keep the order they were written in."""

    name: Annotated[str, Field(pattern=STAGE_NAME)]
    base_model: str
    allow_custom_code: bool = False
    defaults: Defaults = Defaults()
    stages: dict[str, Stage]

    def stage_model(self, name: str) -> str:
        """The model a stage starts from: its own `model:` or the pipeline's base model."""
        return self.stages[name].model or self.base_model

    def stage_setting(self, name: str, key: str) -> Any:
        """A stage's own value for backend/workers/precision, else the pipeline default."""
        value = getattr(self.stages[name], key)
        return getattr(self.defaults, key) if value is None else value


class Header(Strict):
    """The top level with stages left raw, so that each stage is validated by its own kind."""

    name: Annotated[str, Field(pattern=STAGE_NAME)]
    base_model: str
    allow_custom_code: bool = False
    defaults: Defaults = Defaults()
    stages: Annotated[dict[Annotated[str, Field(pattern=STAGE_NAME)], Any], Field(min_length=1)]


class UniqueKeyLoader(yaml.SafeLoader):
    """`safe_load` that refuses a repeated key: a second `dpo:` stage must not silently replace the first."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} appears twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Path) -> dict[str, Any]:
    """Parse the file with `safe_load`; YAML syntax errors become a problem with a line number."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError([Problem(str(path), f"cannot read the pipeline file: {err.strerror}")]) from None
    except UnicodeDecodeError:
        raise ConfigError([Problem(str(path), "the pipeline file is not UTF-8 text")]) from None
    try:
        raw = yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "YAML"
        reason = getattr(err, "problem", None) or str(err)
        raise ConfigError([Problem(where, f"invalid YAML: {reason}")], source=str(path)) from None
    if not isinstance(raw, dict):
        raise ConfigError(
            [Problem("", "the file must be a YAML mapping with name, base_model and stages")],
            source=str(path),
        )
    return raw


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> None:
    """Apply `key.path=value` overrides in place; values are parsed as YAML (`0.2`, `true`, `[a, b]`)."""
    problems = []
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            problems.append(Problem(f"--set {item}", "expected key.path=value, e.g. stages.dpo.trl.beta=0.2"))
            continue
        node = raw
        *parents, leaf = key.split(".")
        for depth, part in enumerate(parents):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                problems.append(
                    Problem(".".join(parents[: depth + 1]), f"--set {key}: this is not a mapping")
                )
                break
            node = child
        else:
            try:
                node[leaf] = yaml.safe_load(value)
            except yaml.YAMLError as err:
                problems.append(
                    Problem(f"--set {item}", f"the value is not valid YAML: {getattr(err, 'problem', err)}")
                )
    if problems:
        raise ConfigError(problems)


def validate_stage(name: str, raw_stage: Any) -> tuple[Stage | None, list[Problem]]:
    """Validate one stage with the model of its `kind`."""
    where = f"stages.{name}"
    if not isinstance(raw_stage, dict):
        return None, [Problem(where, "a stage must be a mapping with at least `kind`")]
    kind = raw_stage.get("kind")
    if not isinstance(kind, str) or kind not in STAGE_KINDS:
        allowed = ", ".join(STAGE_KINDS)
        return None, [Problem(f"{where}.kind", f"{kind!r} is not a stage kind; allowed: {allowed}")]
    try:
        return STAGE_KINDS[kind].model_validate(raw_stage), []
    except ValidationError as err:
        return None, pydantic_problems(err, prefix=where, model=STAGE_KINDS[kind])


def parse(raw: dict[str, Any]) -> Pipeline:
    """Validate a raw mapping into a Pipeline, collecting every problem before raising."""
    from align.checks import cross_check  # imports TRL lazily; only needed once the shape is valid
    from align.trl_args import trl_problems

    problems: list[Problem] = []
    try:
        header = Header.model_validate(raw)
    except ValidationError as err:
        problems += pydantic_problems(err, prefix="", model=Header)
        header = None
    stages: dict[str, Stage] = {}
    raw_stages = raw.get("stages")
    for name, raw_stage in raw_stages.items() if isinstance(raw_stages, dict) else []:
        stage, stage_problems = validate_stage(str(name), raw_stage)
        problems += stage_problems
        if stage is not None:
            stages[str(name)] = stage
            problems += trl_problems(stage.kind, getattr(stage, "trl", {}), f"stages.{name}.trl")
    if header is None or problems:
        raise ConfigError(problems)
    pipeline = Pipeline(**{**header.model_dump(exclude={"stages"}), "stages": stages})
    problems = cross_check(pipeline)
    if problems:
        raise ConfigError(problems)
    return pipeline


def load(path: str | Path, overrides: list[str] | None = None) -> Pipeline:
    """Read, override and validate a pipeline file; every problem is reported at once."""
    path = Path(path)
    raw = read_yaml(path)
    try:
        apply_overrides(raw, overrides or [])
        return parse(raw)
    except ConfigError as err:
        raise ConfigError(err.problems, source=str(path)) from None
