"""Every model a stage runs forwards through sits on the training device: the Trainer moves only the
model it trains, and only in `train()`, so align places the frozen ones (reference copy, PPO's reward
models) itself, and the trained one before training when the backend (ZeRO-2) would leave it on the CPU
for the measurements taken before training. On CPU the training device is the CPU; a second device is
stood in for by `meta`, to which the placement must move every parameter and buffer it is given, unless
the backend holds its models sharded (fsdp)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from align.models.loading import load_causal_lm, resolve_model
from align.pipeline.file import parse
from align.planning.hardware import Hardware
from align.planning.plan import build
from align.stages.context import StageContext, on_training_device

CPU = Hardware(accelerator=False, device_memory=80 * 10**9)


def context(backend: str, workers: int) -> StageContext:
    pipeline = parse(
        {
            "name": "placed",
            "base_model": "tiny",
            "defaults": {"backend": backend, "workers": workers, "precision": "fp32"},
            "stages": {"sft": {"kind": "sft", "data": {"train": "align:chatterbot/sft/train"}}},
        }
    )
    return StageContext(plan=build(pipeline, CPU).stages["sft"], output_dir=None)


@pytest.mark.parametrize("backend", ["ddp", "zero2"])
def test_a_frozen_model_is_moved_whole_to_the_device_it_is_given(backend: str) -> None:
    model = load_causal_lm(resolve_model("tiny"))
    placed = on_training_device(context(backend, 1), model, torch.device("meta"))
    tensors = [*placed.parameters(), *placed.buffers()]
    assert tensors and all(t.device.type == "meta" for t in tensors)


def test_the_training_device_is_the_cpu_without_an_accelerator() -> None:
    ctx = context("ddp", 1)
    model = on_training_device(ctx, load_causal_lm(resolve_model("tiny")))
    assert ctx.device == torch.device("cpu") and {p.device.type for p in model.parameters()} == {"cpu"}
    gpu = dataclasses.replace(ctx, plan=dataclasses.replace(ctx.plan, accelerator=True))
    assert gpu.device == torch.device("cuda", 0)


def test_a_sharding_backend_keeps_its_frozen_shards_where_it_put_them() -> None:
    model = load_causal_lm(resolve_model("tiny"))
    assert on_training_device(context("fsdp", 2), model, torch.device("meta")) is model
    assert {p.device.type for p in model.parameters()} == {"cpu"}


def test_a_model_already_on_the_device_is_not_moved(monkeypatch) -> None:
    """A 4-bit model is placed as it loads, and a bitsandbytes model may refuse `.to()`: none is called."""
    model = load_causal_lm(resolve_model("tiny"), quantize_4bit=True)  # on the CPU, this rank's device here

    def refuse(*args, **kwargs):
        raise AssertionError("moved a model that was already on its device")

    monkeypatch.setattr(model, "to", refuse)
    assert on_training_device(context("zero2", 1), model) is model
