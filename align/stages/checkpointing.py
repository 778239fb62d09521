"""Checkpoints a run can resume from: marked complete only once every rank has written its part, and
taken every `save_steps` steps or every `checkpoint_minutes` minutes, whichever comes first."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from transformers import TrainerCallback

from align.stages.checkpoints import COMPLETE


def agree(flag: bool, device: torch.device) -> bool:
    """True on every rank when it is true on any: ranks must decide to checkpoint together."""
    if not torch.distributed.is_initialized():
        return flag
    value = torch.tensor([float(flag)], device=device)
    torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
    return bool(value.item())


class MarkComplete(TrainerCallback):
    """After every rank has saved its part of a checkpoint, rank 0 marks the folder complete.

    Registered after the backend's callbacks, so a sharded optimizer state (fsdp) is already on disk."""

    def on_save(self, args, state, control, **kwargs):
        if torch.distributed.is_initialized():
            torch.distributed.barrier()
        if state.is_world_process_zero:
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            marker = {"step": state.global_step, "max_steps": state.max_steps, "time": time.time()}
            (folder / COMPLETE).write_text(json.dumps(marker) + "\n")


class SaveEveryMinutes(TrainerCallback):
    """Asks for a checkpoint once `minutes` have passed since the last one, so a slow stage whose
    `save_steps` is far away still loses at most that much work."""

    def __init__(self, minutes: float) -> None:
        self.seconds = minutes * 60
        self.last = time.monotonic()

    def on_train_begin(self, args, state, control, **kwargs):
        self.last = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        if args.save_strategy == "no":  # checkpoints turned off
            return
        if agree(time.monotonic() - self.last >= self.seconds, args.device):
            control.should_save = True

    def on_save(self, args, state, control, **kwargs):
        self.last = time.monotonic()


def checkpoint_callbacks(minutes: float) -> list[TrainerCallback]:
    return [SaveEveryMinutes(minutes), MarkComplete()]
