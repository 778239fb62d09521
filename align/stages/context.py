"""What a stage runner receives and returns, and the loading steps every runner shares."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from align.data import load_data
from align.models import load_causal_lm, load_tokenizer
from align.placement import REFERENCE_COPY
from align.plan import StagePlan
from align.spec import LoraSpec, TrainingStage
from align.trl_args import build_config

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class ModelInput:
    """A stage's input model: a base folder plus the adapters to apply on it, in order."""

    base: str
    adapters: tuple[str, ...] = ()

    def with_adapter(self, adapter: str) -> ModelInput:
        return ModelInput(self.base, (*self.adapters, adapter))


@dataclass(frozen=True)
class StageContext:
    """One rank's view of a stage: its plan, its input model, where to write, and its backend."""

    plan: StagePlan
    model_input: ModelInput
    output_dir: Path
    backend: ModuleType
    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.plan.precision]


@dataclass
class StageResult:
    """What a runner produced: `adapter` or `model` (a folder of that name) and its final metrics."""

    output: str
    metrics: dict[str, float] = field(default_factory=dict)


def load_stage_model(ctx: StageContext, *, quantize_4bit: bool = False) -> torch.nn.Module:
    """The input model with its earlier adapters merged in, loaded the way the backend asks."""
    # a backend may override the dtype (FSDP keeps fp32 shards and computes in bf16)
    kwargs = {"dtype": ctx.dtype, **ctx.backend.model_kwargs(ctx.plan)}
    model = load_causal_lm(ctx.model_input.base, quantize_4bit=quantize_4bit, **kwargs)
    if ctx.model_input.adapters:
        from peft import PeftModel

        for adapter in ctx.model_input.adapters:
            model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    return ctx.backend.prepare(model, ctx.plan)


def frozen_reference(ctx: StageContext) -> torch.nn.Module | None:
    """The reference model when the plan places a frozen copy (full parameters), loaded and placed like
    the policy (sharded under fsdp); None when there is none to load (LoRA disables the adapters)."""
    if ctx.plan.placement.reference != REFERENCE_COPY:
        return None
    return load_stage_model(ctx).requires_grad_(False).eval()


def stage_tokenizer(ctx: StageContext, *, padding_side: str = "right"):
    """The input model's tokenizer (saved beside every adapter and model align writes)."""
    source = ctx.model_input.adapters[-1] if ctx.model_input.adapters else ctx.model_input.base
    tokenizer = load_tokenizer(source)
    tokenizer.padding_side = padding_side
    return tokenizer


def peft_config(lora: LoraSpec | None):
    """PEFT's LoraConfig for a stage's `lora:` block; TRL applies it and handles 4-bit preparation."""
    if lora is None:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha or 2 * lora.r,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )


def stage_data(stage: TrainingStage, name: str, kind: str) -> tuple[Any, Any]:
    """Train and eval datasets, trimmed to the row limits the stage sets."""
    train = load_data(stage.data.train, kind, f"stages.{name}.data.train")
    if stage.data.max_train_rows:
        train = train.select(range(min(stage.data.max_train_rows, len(train))))
    if stage.data.eval is None:
        return train, None
    evaluation = load_data(stage.data.eval, kind, f"stages.{name}.data.eval")
    if stage.data.max_eval_rows:
        evaluation = evaluation.select(range(min(stage.data.max_eval_rows, len(evaluation))))
    return train, evaluation


def stage_config(ctx: StageContext, kind: str, overrides: dict[str, Any] | None = None) -> Any:
    """TRL's config for this stage: its `trl:` block (plus what the runner must set), and what align
    owns: outputs under the stage folder, precision, seed, and the backend's trainer arguments."""
    return build_config(
        kind,
        {**ctx.plan.stage.trl, **(overrides or {})},
        output_dir=str(ctx.output_dir / "checkpoints"),
        precision=ctx.plan.precision,
        seed=ctx.plan.seed,
        **ctx.backend.trainer_args(ctx.plan),
    )


def save_outputs(ctx: StageContext, trainer: Any, tokenizer: Any, output: str) -> dict[str, float]:
    """Save `output/` (adapter or model) with its tokenizer and the loss log; the loss curve's ends."""
    trainer.save_model(str(ctx.output_dir / output))  # every rank: a sharded model gathers collectively
    if not ctx.is_main:
        return {}
    tokenizer.save_pretrained(str(ctx.output_dir / output))
    return loss_curve(write_log_history(trainer, ctx.output_dir))


def local_tensor(param: torch.Tensor) -> torch.Tensor:
    """This rank's part of a parameter: its shard under FSDP2, else the parameter itself."""
    return param.to_local() if hasattr(param, "to_local") else param


def trainable_snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of this rank's part of every trainable parameter, to tell after training which ones moved."""
    return {
        name: local_tensor(param).detach().clone()
        for name, param in model.named_parameters()
        if param.requires_grad
    }


def changed_share(model: torch.nn.Module, snapshot: dict[str, torch.Tensor]) -> float:
    """Share of the snapshot's parameters that training changed, on any rank (every rank must call it)."""
    params = dict(model.named_parameters())
    flags = torch.tensor(
        [
            float(not torch.equal(local_tensor(params[name]).detach(), before))
            for name, before in snapshot.items()
        ]
    )
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
    return float(flags.mean()) if len(flags) else 0.0


def step_seconds(trainer: Any) -> dict[str, float]:
    """Mean wall time per optimizer step of the run just trained."""
    runtime = next(
        (entry["train_runtime"] for entry in trainer.state.log_history if "train_runtime" in entry), None
    )
    steps = trainer.state.global_step
    return {"seconds_per_step": runtime / steps} if runtime and steps else {}


def write_log_history(trainer: Any, output_dir: Path) -> list[dict[str, Any]]:
    """Every logged step to logs/metrics.jsonl, so a run's curve survives beside its outputs."""
    history = trainer.state.log_history
    logs = output_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / "metrics.jsonl", "w") as out:
        for entry in history:
            out.write(json.dumps(entry) + "\n")
    return history


def loss_curve(history: list[dict[str, Any]], key: str = "loss", name: str | None = None) -> dict[str, float]:
    """First and last logged training loss (or other `key`, as `train_<name>_first/last`): the two numbers
    that say whether training worked."""
    losses = [entry[key] for entry in history if key in entry]
    if not losses:
        return {}
    name = name or key
    return {f"train_{name}_first": float(losses[0]), f"train_{name}_last": float(losses[-1])}
