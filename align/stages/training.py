"""The one skeleton every training runner shares: verify, measure and sample, train, measure and sample,
save, record.

A runner builds its trainer and says what is its own (`Training`): its held-out measurement and the
prompts it samples, the curves its log holds, how its output is saved. `train_stage` does the rest, in
the same order for every kind, so a new kind is a table row, its spec and a short runner.
"""

from __future__ import annotations

import itertools
import json
import statistics
import time
from collections.abc import Callable
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
class Training:
    """What a runner built, and what is its own.

    held_out(phase): metrics for "before" or "after" training, named as recorded (`suffixed` helps);
        every rank calls it, since a sharded model's forward is a collective.
    curves: (log key, name) pairs whose first and last logged values become `train_<name>_first/last`.
    save(folder): writes the output on every rank; default `trainer.save_model`.
    model: what the backend verifies and whose trainable parameters must move; default `trainer.model`.
    sample_prompts: held-out prompts whose greedy completions are recorded before and after training.
    sampler: the model that completes them; default `trainer.model` (none for a reward model: it scores).
    run_metrics(): figures of the training run itself, read after it (PPO's time split).
    counts: what `max_length` did to the rows (`Preamble.counts`), recorded as they were counted.
    """

    trainer: Any
    tokenizer: Any
    output: str  # "adapter" or "model": the folder the next stage reads
    held_out: Callable[[str], dict[str, float]] = no_measure
    curves: tuple[tuple[str, str], ...] = (("loss", "loss"),)
    save: Callable[[Path], None] | None = None
    model: Any = None
    sample_prompts: list[Any] = field(default_factory=list)
    sampler: Any = None
    run_metrics: Callable[[], dict[str, float]] = dict
    counts: dict[str, float] = field(default_factory=dict)


def train_stage(ctx: StageContext, training: Training) -> StageResult:
    """Verify the backend, measure held out and sample it, train, measure and sample again, save output (in
    its export dtype) and tokenizer, and record the curves, the step time, the share of trainable parameters
    that moved and whether a reference copy was loaded."""
    trainer = training.trainer
    model = training.model if training.model is not None else trainer.model
    sampler = training.sampler if training.sampler is not None else trainer.model
    prompts = training.sample_prompts
    clock, steps = PhaseClock(ctx.started), StepClock()
    clock.lap("prepare")  # data, tokenizer, model and trainer, since the rank took up the stage
    trainer.add_callback(steps)
    hold_trainable(model, DTYPES[ctx.plan.trainable_dtype])
    ctx.backend.verify(model, ctx.plan)
    # ZeRO-2 moves the model only in train(): what is measured before training runs where the rest does
    on_training_device(ctx, sampler)
    metrics = dict(training.held_out("before"))
    clock.lap("measure_before")
    completions_before = greedy_completions(sampler, training.tokenizer, prompts)
    clock.lap("samples_before")
    before = trainable_checksums(model)
    resume = str(ctx.resume_from) if ctx.resume_from else trainer.args.resume_from_checkpoint
    trainer.train(resume_from_checkpoint=resume)
    clock.lap("train")
    metrics.update(training.held_out("after"))
    clock.lap("measure_after")
    completions_after = greedy_completions(sampler, training.tokenizer, prompts)
    clock.lap("samples_after")
    metrics["trainable_changed"] = changed_share(model, before)
    # proof of the placement: 1 when the trainer holds a separate frozen reference model
    metrics["reference_copy_loaded"] = float(getattr(trainer, "ref_model", None) is not None)
    metrics.update(step_seconds(trainer))
    metrics.update(steps.steady())
    metrics.update(training.run_metrics())
    metrics.update(training.counts)
    folder = ctx.output_dir / training.output
    if training.save is not None:
        training.save(folder)
    else:
        trainer.save_model(str(folder))  # every rank: a sharded model gathers collectively
    if ctx.is_main:
        publish(ctx, folder, training.output)
        training.tokenizer.save_pretrained(str(folder))
        history = write_log_history(trainer, ctx.output_dir)
        for key, name in training.curves:
            metrics.update(curve_ends(history, key, name))
    clock.lap("save")
    metrics.update(clock.seconds)
    samples = paired(prompts, completions_before, completions_after)
    steps = trainer.state.global_step
    return StageResult(output=training.output, metrics=metrics, steps=steps, samples=samples)


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
