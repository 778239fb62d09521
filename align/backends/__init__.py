"""Distributed backends: each is a module of plain functions from a stage plan to launch settings.

A backend knows DeepSpeed or FSDP and nothing of DPO or PPO; a stage runner asks it for what it
needs and never tests which backend it has. Each module provides:
- `model_kwargs(plan) -> dict`: extra `from_pretrained` arguments;
- `prepare(model, plan) -> model`: wrapping or sharding after load (and after earlier adapters merge);
- `trainer_args(plan) -> dict`: extra TRL/`TrainingArguments` fields (e.g. `deepspeed=`);
- `callbacks(plan, logs_dir) -> list`: trainer callbacks (per-rank placement report, checkpoints);
- `verify(model, plan)`: fail loudly if the backend did not do what it claims (e.g. no sharding).
"""

from __future__ import annotations

from types import ModuleType

from align.backends import ddp, fsdp, zero2

BACKENDS: dict[str, ModuleType] = {"ddp": ddp, "zero2": zero2, "fsdp": fsdp}


def backend_for(name: str) -> ModuleType:
    """The module implementing a backend the plan chose."""
    return BACKENDS[name]
