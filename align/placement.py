"""Where each model of a stage lives (policy, reference, reward, value), decided per backend.

This is the one place that decides it: `align plan` prints it, the memory plan counts it, and the
stage runners follow it by asking for `Placement.reference` instead of testing the backend.
"""

from __future__ import annotations

from dataclasses import dataclass

from align.memory import FrozenModel

REFERENCE_NONE = "none"
REFERENCE_ADAPTERS_DISABLED = "adapters-disabled"
REFERENCE_COPY = "frozen-copy"
REFERENCE_PRECOMPUTED = "precomputed"


@dataclass(frozen=True)
class Placement:
    """For each model role, how it is held; `reference` is what a DPO runner acts on."""

    policy: str
    reference: str
    description: dict[str, str]


def policy_placement(backend: str, lora: bool, quantize_4bit: bool) -> str:
    """How the trained model is held on each rank."""
    base = "4-bit NF4 base + LoRA adapters" if quantize_4bit else ("base + LoRA adapters" if lora else "full")
    held = {
        "ddp": "replicated on every rank",
        "zero2": "weights replicated; grads and optimizer states sharded",
        "fsdp": "parameters, grads and optimizer states sharded",
    }[backend]
    return f"{base}, {held}"


def plan_placement(
    kind: str, backend: str, lora: bool, quantize_4bit: bool, precompute: bool = False
) -> Placement:
    """The placement of every model a stage kind uses under one backend.

    `precompute`: the full-parameter reference is replaced by log-probs computed from the policy
    before its first step (when it still is the reference), so no copy is kept during training.
    """
    policy = policy_placement(backend, lora, quantize_4bit)
    if kind != "dpo":
        return Placement(policy, REFERENCE_NONE, {"policy": policy})
    if lora:
        reference, how = REFERENCE_ADAPTERS_DISABLED, "the policy's base with adapters disabled (no copy)"
    elif precompute and backend != "fsdp":
        reference, how = (
            REFERENCE_PRECOMPUTED,
            "log-probs precomputed from the policy before training (no copy)",
        )
    elif backend == "fsdp":
        reference, how = REFERENCE_COPY, "frozen copy, sharded like the policy"
    else:
        reference, how = REFERENCE_COPY, "frozen copy, replicated on every rank"
    return Placement(policy, reference, {"policy": policy, "reference": how})


def frozen_models(placement: Placement, param_count: int, dtype: str) -> tuple[FrozenModel, ...]:
    """The frozen models the memory plan must count for this placement."""
    if placement.reference != REFERENCE_COPY:
        return ()
    return (FrozenModel("reference", param_count, dtype),)
