"""What a stage's `precision` means: the dtype it computes in, and the dtype its trained weights are held in.

`bf16` and `fp16` are mixed precision on every backend: the optimizer steps fp32 weights with fp32 Adam
moments, and the forward and backward run in 16 bits. How each backend gets there:
- ddp: the weights load in fp32 and the Trainer autocasts (torch.autocast, on CPU as on GPU);
- fsdp: fp32 shards, and FSDP2's `MixedPrecisionPolicy` gathers them in bf16 and reduces gradients in fp32;
- zero2: DeepSpeed casts the weights to 16 bits and steps its own fp32 master partition, so the model loads
  in the compute dtype;
- LoRA: the frozen base is held in the compute dtype, the adapters in fp32 (or, under zero2, in 16 bits
  beside DeepSpeed's fp32 master).
`bf16-pure` is the explicit opt-in to bf16 weights and bf16 Adam moments with no fp32 copy anywhere: half
the model-state memory, and updates below bf16's resolution (about 4e-3 of a weight near 1.0) are lost.
Nothing here imports torch: the plan reads it.
"""

from __future__ import annotations

from typing import Any

from align.errors import Problem

PURE = "bf16-pure"
MIXED = ("bf16", "fp16")
PURE_RISK = "no fp32 master copy; small updates to weights near 1.0 are lost"


def compute_dtype(precision: str) -> str:
    """The dtype forward and backward run in: `bf16-pure` computes in bf16 like `bf16`."""
    return "bf16" if precision == PURE else precision


def trainable_dtype(precision: str, engine_master: bool) -> str:
    """The dtype the trained parameters are held in on each rank.

    fp32 under mixed precision, unless the backend's engine casts them to 16 bits and keeps its own fp32
    master copy (`engine_master`: DeepSpeed); the compute dtype under fp32 and `bf16-pure`.
    """
    if precision in MIXED and not engine_master:
        return "fp32"
    return compute_dtype(precision)


def describe(precision: str, trainable: str, lora: bool) -> str:
    """The precision as it runs, in one phrase for `align plan`."""
    compute = compute_dtype(precision)
    if compute == "fp32":
        return "fp32"
    if precision == PURE:
        return f"{PURE} (bf16 weights and Adam state, no fp32 master copy)"
    held = "adapters" if lora else "weights"
    base = f"{compute} frozen base, " if lora else ""
    if trainable == "fp32":
        return f"{precision} (mixed: {base}fp32 {held} and Adam state, {compute} compute)"
    return f"{precision} (mixed: {base}{compute} {held}, fp32 master copy and Adam state in DeepSpeed)"


def resolve_precision(requested: str, hardware: Any) -> str:
    """`auto` is bf16 (mixed) where the accelerator (the plan's `Hardware`) has it, else fp32 (CPUs train
    in fp32 here)."""
    if requested != "auto":
        return requested
    return "bf16" if hardware.bf16 else "fp32"


def precision_problems(stage: Any, where: str, precision: str) -> list[Problem]:
    """`bf16-pure` trains full parameters only: a LoRA stage's adapters are small and already train in
    fp32 over a bf16 base under `bf16`, so pure bf16 would risk their updates for almost no memory. `stage`
    is a training stage (config's TrainingStage, which this package sits below)."""
    if precision == PURE and stage.lora is not None:
        return [
            Problem(
                f"{where}.precision" if stage.precision else "defaults.precision",
                "bf16-pure is for full-parameter training; with `lora:` use `precision: bf16` (a bf16 base, "
                "fp32 adapters)",
            )
        ]
    return []
