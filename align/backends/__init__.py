"""Distributed backends: each is a module of plain functions from a stage plan to launch settings.

A backend knows DeepSpeed or FSDP and nothing of DPO or PPO; a stage runner asks it for
trainer arguments and model-loading arguments, and never tests which backend it has.
"""

from __future__ import annotations

from types import ModuleType

from align.backends import ddp

BACKENDS: dict[str, ModuleType] = {"ddp": ddp}


def backend_for(name: str) -> ModuleType:
    """The module implementing a backend the plan chose."""
    if name not in BACKENDS:
        raise NotImplementedError(f"backend {name!r} is not available yet; use one of {', '.join(BACKENDS)}")
    return BACKENDS[name]
