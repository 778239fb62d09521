"""The steps every training runner shares, each called by name from the runner, in its order: the clocks
start once the trainer is built (`start_clocks`), the backend verifies the model (`ready`), the held-out
prompts are sampled (`sampled`), TRL trains (`train`), the run is judged (`trained`: did every trainable
parameter move), the output is saved and published (`save_output`, `published`), and the result is made
(`finished`). What a kind measures, and how, is its runner's own.
"""

from __future__ import annotations

import itertools
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from align.records import StageResult
from align.stages.context import DTYPES, StageContext, on_training_device
from align.stages.export import publish
from align.stages.samples import greedy_completions, paired
from align.trainers.sampling import train_runtime


def no_measure(phase: str) -> dict[str, float]:
    return {}


@dataclass
class Clocks:
    """The stage's two clocks: the seconds of each part (`time_<part>_s`) and each optimizer step's."""

    phases: PhaseClock
    steps: StepClock

    def lap(self, part: str) -> None:
        self.phases.lap(part)


def start_clocks(ctx: StageContext, trainer: Any) -> Clocks:
    """The trainer is built: `time_prepare_s` (data, tokenizer, model and trainer, since the rank took up
    the stage) ends here, and each optimizer step is timed from now on."""
    clocks = Clocks(PhaseClock(ctx.started), StepClock())
    clocks.lap("prepare")
    trainer.add_callback(clocks.steps)
    return clocks


def ready(ctx: StageContext, model: Any, sampler: Any) -> None:
    """Hold the trained parameters in the plan's dtype, let the backend verify `model`, and put `sampler`
    on the training device: ZeRO-2 moves the model only in train(), and what is measured before training
    runs where the rest does."""
    hold_trainable(model, DTYPES[ctx.plan.trainable_dtype])
    ctx.backend.verify(model, ctx.plan)
    on_training_device(ctx, sampler)


def sampled(clocks: Clocks, phase: str, sampler: Any, tokenizer: Any, prompts: list[Any]) -> list[str]:
    """Greedy completions of the held-out prompts, `before` or `after` training (`time_samples_<phase>_s`)."""
    completions = greedy_completions(sampler, tokenizer, prompts)
    clocks.lap(f"samples_{phase}")
    return completions


def train(ctx: StageContext, trainer: Any, clocks: Clocks) -> None:
    """TRL's train loop, resumed from the checkpoint the driver chose (or the `trl:` block's)."""
    resume = str(ctx.resume_from) if ctx.resume_from else trainer.args.resume_from_checkpoint
    trainer.train(resume_from_checkpoint=resume)
    clocks.lap("train")


def trained(trainer: Any, model: Any, checksums: dict[str, torch.Tensor], clocks: Clocks) -> dict[str, float]:
    """What the run itself says: the share of trainable parameters that moved (every rank), whether the
    trainer held a separate frozen reference (proof of the placement), and the step times."""
    metrics = {"trainable_changed": changed_share(model, checksums)}
    metrics["reference_copy_loaded"] = float(getattr(trainer, "ref_model", None) is not None)
    return {**metrics, **step_seconds(trainer), **clocks.steps.steady()}


def save_output(ctx: StageContext, trainer: Any, output: str) -> Path:
    """`trainer.save_model` on every rank (a sharded model gathers collectively) into the output folder."""
    folder = ctx.output_dir / output
    trainer.save_model(str(folder))
    return folder


def published(
    ctx: StageContext, trainer: Any, tokenizer: Any, output: str, curves: tuple[tuple[str, str], ...]
) -> dict[str, float]:
    """On rank 0: the output published (in its export dtype) with its tokenizer, the log history written,
    and the first and last values of each `(log key, name)` curve."""
    if not ctx.is_main:
        return {}
    folder = ctx.output_dir / output
    publish(ctx, folder, output)
    tokenizer.save_pretrained(str(folder))
    history = write_log_history(trainer, ctx.output_dir)
    return {name: value for key, curve in curves for name, value in curve_ends(history, key, curve).items()}


def finished(
    clocks: Clocks,
    metrics: dict[str, float],
    trainer: Any,
    output: str,
    samples: tuple[list[Any], list[str], list[str]],
) -> StageResult:
    """The stage's result, once saved (`time_save_s`): its metrics with every part's seconds, and the
    held-out prompts with their completions before and after."""
    clocks.lap("save")
    metrics = {**metrics, **clocks.phases.seconds}
    steps = trainer.state.global_step
    return StageResult(output=output, metrics=metrics, steps=steps, samples=paired(*samples))


@dataclass
class PhaseClock:
    """Seconds each part of a stage took, recorded as `time_<part>_s`: what align does around TRL's train
    loop (preparing, the held-out measures, samples, saving) is priced in the record, not guessed."""

    last: float
    seconds: dict[str, float] = field(default_factory=dict)

    def lap(self, part: str) -> None:
        now = time.perf_counter()
        self.seconds[f"time_{part}_s"] = now - self.last
        self.last = now


class StepClock(TrainerCallback):
    """The wall time of each optimizer step. The first step also warms up (allocations, lazy inits), and an
    evaluation at the start runs before it: their median without it is the step a user times."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.ends.append(time.perf_counter())

    def steady(self) -> dict[str, float]:
        """`seconds_per_step_steady`, once two steps after the first have ended."""
        laps = [later - earlier for earlier, later in itertools.pairwise(self.ends)]
        return {"seconds_per_step_steady": statistics.median(laps)} if len(laps) >= 2 else {}


@torch.no_grad()
def hold_trainable(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Hold every trained parameter in the plan's dtype before the optimizer is built: fp32 under mixed
    precision, where TRL casts QLoRA adapters to bf16 (which would leave them with no fp32 copy)."""
    for param in model.parameters():
        if param.requires_grad and param.is_floating_point() and param.dtype != dtype:
            param.data = param.data.to(dtype)


def suffixed(metrics: dict[str, float], phase: str) -> dict[str, float]:
    """`{"accuracy": x}` measured "before" -> `{"accuracy_before": x}`."""
    return {f"{key}_{phase}": value for key, value in metrics.items()}


def local_tensor(param: torch.Tensor) -> torch.Tensor:
    """This rank's part of a parameter: its shard under FSDP2, else the parameter itself."""
    return param.to_local() if hasattr(param, "to_local") else param


@torch.no_grad()
def trainable_checksums(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Sum and sum of squares of this rank's part of each trainable parameter, in fp64: two numbers per
    tensor say whether training moved it, without a copy of the weights."""
    sums = {}
    for name, param in model.named_parameters():
        if param.requires_grad:
            values = local_tensor(param).detach().double()
            sums[name] = torch.stack([values.sum(), values.square().sum()]).cpu()
    return sums


def changed_share(model: torch.nn.Module, before: dict[str, torch.Tensor]) -> float:
    """Share of the trainable parameters that training changed on any rank (every rank must call it)."""
    after = trainable_checksums(model)
    flags = torch.tensor([float(not torch.equal(after[name], sums)) for name, sums in before.items()])
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
    return float(flags.mean()) if len(flags) else 0.0


def step_seconds(trainer: Any) -> dict[str, float]:
    """Mean wall time per optimizer step of the run just trained."""
    runtime = train_runtime(trainer)
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


def curve_ends(history: list[dict[str, Any]], key: str, name: str) -> dict[str, float]:
    """First and last logged value of `key` as `train_<name>_first/last`: the two numbers that say
    whether training worked."""
    values = [entry[key] for entry in history if key in entry]
    if len(values) < 2:  # one log says nothing about a trend: first == last would read as "no learning"
        return {f"train_{name}_mean": float(values[0])} if values else {}
    return {f"train_{name}_first": float(values[0]), f"train_{name}_last": float(values[-1])}
