"""FSDP2's torch side: shard storage, tuning, the proof of sharding, and DCP checkpoints (see fsdp.py)."""

from __future__ import annotations

import json
import random
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, distribute_tensor
from transformers import TrainerCallback
from transformers.modeling_layers import GradientCheckpointingLayer

from align.backends.sharding_report import global_numel, local_numel
from align.compat.torch import local_shard, replace_local_shard

if TYPE_CHECKING:
    from align.backends.base import PlannedStage

# Shard(0) splits a parameter's first dimension in equal chunks but the last, so a rank may hold a little
# more or less than total / workers; DDP would hold `workers` times as much.
SHARD_TOLERANCE = 0.1

# Every model `prepare` sharded in this process, the frozen DPO reference included, for the report.
SHARDED_MODELS: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()


def decoder_layers(model: torch.nn.Module) -> list[FSDPModule]:
    """The per-layer FSDP units, in forward order."""
    return [
        m for m in model.modules() if isinstance(m, GradientCheckpointingLayer) and isinstance(m, FSDPModule)
    ]


def prepare(model: Any, plan: PlannedStage) -> Any:
    """Give the shards their own memory, apply the stage's FSDP settings, then prove the sharding.

    Resharding is set on every unit, the root included: transformers keeps the root and the head gathered
    after forward, which a frozen DPO reference (no backward to reshard it) would then hold for good.
    """
    own_shard_storage(model)
    spec = plan.stage.fsdp
    model.set_reshard_after_forward(spec.reshard_after_forward)
    if spec.prefetch:
        layers = decoder_layers(model)
        for earlier, later in zip(layers, layers[1:], strict=False):
            earlier.set_modules_to_forward_prefetch([later])
            later.set_modules_to_backward_prefetch([earlier])
    if spec.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.register_load_state_dict_pre_hook(shard_full_tensors)
    verify(model, plan)
    SHARDED_MODELS.add(model)
    return model


def own_shard_storage(model: torch.nn.Module) -> None:
    """Copy every shard that is a view of a larger tensor into a storage of its own.

    transformers cuts each rank's shard at load as a slice of the whole tensor it read and moves it with
    `.to(device, dtype)`, which on CPU in the checkpoint's dtype copies nothing. Each shard stays a view of
    the whole tensor, itself in safetensors' copy-on-write mapping of the checkpoint file: 1/N of the
    elements behind all of the bytes, the file mapped for the whole run, and storage accounting (the
    bench, `verify`) that cannot tell it from an unsharded model. (On GPU the move copies just the shard,
    and nothing is done here.) Runs before the first forward, whose FSDP2 lazy init takes each
    parameter's sharded data from its local tensor, so the copy is what FSDP gathers and the optimizer
    steps.
    """
    for param in model.parameters():
        if not isinstance(param, DTensor):
            continue
        local = local_shard(param)
        if local.untyped_storage().nbytes() > local.numel() * local.element_size():
            replace_local_shard(param, local.clone(memory_format=torch.contiguous_format))


def shard_full_tensors(model: torch.nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """Load pre-hook: cut full tensors into this rank's shards, so that a full `load_state_dict` works.

    The Trainer's resume loads the checkpoint's `model.safetensors` this way, before the DCP restore.
    """
    for name, param in model.named_parameters(remove_duplicate=False):  # tied weights under each name
        value = state_dict.get(prefix + name)
        if isinstance(param, DTensor) and torch.is_tensor(value) and not isinstance(value, DTensor):
            state_dict[prefix + name] = distribute_tensor(
                value.to(param.dtype), param.device_mesh, param.placements, src_data_rank=None
            )


def held_elements(model: torch.nn.Module) -> tuple[int, int, int]:
    """This rank's parameter elements, the whole model's, and how many parameters are DTensors."""
    params = list(model.parameters())
    local = sum(local_numel(p) for p in params)
    total = sum(global_numel(p) for p in params)
    return local, total, sum(isinstance(p, DTensor) for p in params)


def held_storage_bytes(model: torch.nn.Module) -> tuple[int, int]:
    """Bytes of the distinct storages behind this rank's parameters, and the whole model's parameter bytes.

    Elements alone can mislead: a shard that is a view of the whole tensor holds 1/N of the elements and
    all of the memory.
    """
    storages: dict[tuple[str, int], int] = {}
    total = 0
    for param in model.parameters():
        local = local_shard(param) if isinstance(param, DTensor) else param
        total += global_numel(param) * local.element_size()
        if local.device.type != "meta":
            storage = local.untyped_storage()
            storages[(local.device.type, storage.data_ptr())] = storage.nbytes()
    return sum(storages.values()), total


def verify(model: Any, plan: PlannedStage) -> None:
    """Fail loudly unless this rank holds about 1/workers of the parameters, in elements and in bytes.

    Elements catch a silent DDP; the bytes of the storages behind the shards catch shards that keep the
    whole tensors alive.
    """
    local, total, dtensors = held_elements(model)
    storage, total_bytes = held_storage_bytes(model)
    checks = (
        (
            local,
            total,
            f"{total:,} parameter elements",
            f"{dtensors} DTensor parameters",
            "the model is not sharded",
        ),
        (
            storage,
            total_bytes,
            f"bytes of parameter storage ({total_bytes:,} in all)",
            "in the storages behind its shards",
            "the shards are views of larger tensors that stay alive",
        ),
    )
    for held, whole, what, where, verdict in checks:
        expected = whole / plan.workers
        if abs(held - expected) > SHARD_TOLERANCE * expected:
            raise RuntimeError(
                f"stage '{plan.name}': backend fsdp expected each of {plan.workers} ranks to hold about "
                f"{expected:,.0f} of the {what}, but this rank holds {held:,} ({where}): {verdict}"
            )


def training_state(model: torch.nn.Module, optimizer: Any, scheduler: Any) -> dict[str, Any]:
    """Model and optimizer as sharded state dicts (each rank keeps its own shards), and the scheduler."""
    model_state, optimizer_state = get_state_dict(model, getattr(optimizer, "optimizer", optimizer))
    return {"model": model_state, "optimizer": optimizer_state, "scheduler": scheduler}


def save_rng_state(folder: Path) -> None:
    """HF's per-rank RNG file, restored by its resume at the right step (`save_only_model` skips it)."""
    states = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "cpu": torch.random.get_rng_state(),
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.random.get_rng_state_all()
    torch.save(states, folder / f"rng_state_{torch.distributed.get_rank()}.pth")


def save_training_state(folder: Path, model: torch.nn.Module, optimizer: Any, scheduler: Any) -> None:
    """Every rank writes its shards of the model and optimizer states into the checkpoint's DCP folder."""
    dcp.save(training_state(model, optimizer, scheduler), checkpoint_id=folder)
    save_rng_state(folder.parent)


def load_training_state(folder: Path, model: torch.nn.Module, optimizer: Any, scheduler: Any) -> None:
    """Load each rank's shards back from the checkpoint's DCP folder (the plan made sure it exists)."""
    state = training_state(model, optimizer, scheduler)
    dcp.load(state, checkpoint_id=folder)
    set_state_dict(
        model,
        getattr(optimizer, "optimizer", optimizer),
        model_state_dict=state["model"],
        optim_state_dict=state["optimizer"],
    )


class ShardedCheckpoint(TrainerCallback):
    """DCP of model, optimizer and scheduler in `dcp_folder` of each HF checkpoint, loaded back on resume."""

    def __init__(self, dcp_folder: str) -> None:
        self.dcp_folder = dcp_folder

    def on_train_begin(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
        if args.resume_from_checkpoint:
            folder = Path(args.resume_from_checkpoint) / self.dcp_folder
            load_training_state(folder, model, optimizer, lr_scheduler)

    def on_save(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}" / self.dcp_folder
        save_training_state(folder, model, optimizer, lr_scheduler)


class ShardedModelsReport(TrainerCallback):
    """Writes `logs/fsdp-rank{R}.json`: what this rank holds of each model it sharded (policy, reference).

    Elements and the bytes of the storages behind them: a shard can hold 1/N of one and all of the other.
    """

    def __init__(self, logs_dir: Path) -> None:
        self.logs_dir = logs_dir
        self.written = False

    def on_step_end(self, args, state, control, **kwargs):
        if self.written:
            return
        models = []
        for model in SHARDED_MODELS:
            local, total, dtensors = held_elements(model)
            storage, total_bytes = held_storage_bytes(model)
            models.append(
                {
                    "param_elements_local": local,
                    "param_elements_total": total,
                    "param_storage_bytes": storage,
                    "param_bytes_total": total_bytes,
                    "dtensor_params": dtensors,
                    "trainable": any(p.requires_grad for p in model.parameters()),
                }
            )
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        path = self.logs_dir / f"fsdp-rank{args.process_index}.json"
        path.write_text(json.dumps({"models": models}, indent=2) + "\n")
        self.written = True
