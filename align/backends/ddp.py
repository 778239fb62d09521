"""Plain data parallelism: every rank holds the whole model; the baseline the others are measured against."""

from __future__ import annotations

from typing import Any


def trainer_args(plan: Any) -> dict[str, Any]:
    """DDP needs no extra trainer settings beyond telling it every parameter is used."""
    return {"ddp_find_unused_parameters": False} if plan.workers > 1 else {}


def model_kwargs(plan: Any) -> dict[str, Any]:
    """Models load whole on each rank."""
    return {}


def verify(model: Any, plan: Any) -> None:
    """Nothing is sharded, so there is nothing to prove."""
