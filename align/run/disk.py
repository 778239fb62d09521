"""Disk problems found before training, each as one line naming the path: an output root that cannot be
written, and one without room for a stage's checkpoints and output."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from align.errors import AlignError
from align.models.memory import format_bytes
from align.planning.launch import Launch
from align.planning.plan import StagePlan
from align.stages.checkpoints import KEEP

ADAM_BYTES = 12  # per trainable parameter in a checkpoint: fp32 exp_avg, exp_avg_sq and master copy


def probe_writable(folder: Path) -> None:
    """Create the pipeline's output folder and write a byte into it, or say why that fails."""
    probe = folder / f".write-probe-{uuid.uuid4().hex[:8]}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as out:
            out.write(b"\0")
            out.flush()
            os.fsync(out.fileno())
    except OSError as err:
        raise AlignError(
            f"cannot write to {err.filename or folder}: {err.strerror}; set defaults.output_root to a "
            "folder you can write to, or fix its permissions"
        ) from None
    finally:
        probe.unlink(missing_ok=True)


def checkpoint_count(stage: StagePlan) -> int:
    """How many checkpoints a stage may hold at once: `save_total_limit` (align's default 2), plus the one
    being written; none when checkpoints are off."""
    trl = stage.trl
    if str(trl.get("save_strategy", "steps")) == "no":
        return 0
    return int(trl.get("save_total_limit") or KEEP) + 1


def disk_need(launch: Launch) -> int | None:
    """Bytes a stage writes at most: its saved model (an adapter under LoRA) and its checkpoints, each
    the saved model plus the optimizer state. None when the plan has no architecture to count."""
    replica = launch.memory_by_backend.get("ddp")
    if replica is None:
        return None
    trainable = replica.trainable_params
    model = trainable * 4 if launch.plan.lora else replica.device.params
    return model + checkpoint_count(launch.plan) * (model + trainable * ADAM_BYTES)


def check_space(launch: Launch, folder: Path) -> None:
    """Refuse a stage whose outputs cannot fit in the free space of the output folder."""
    stage, need = launch.plan, disk_need(launch)
    free = shutil.disk_usage(folder).free
    if need is not None and need > free:
        raise AlignError(
            f"{folder} has {format_bytes(free)} free; stage '{stage.name}' needs about {format_bytes(need)} "
            f"(its output and {checkpoint_count(stage)} checkpoints with optimizer state). Free space, set "
            f"defaults.output_root elsewhere, or lower stages.{stage.name}.trl.save_total_limit"
        )
