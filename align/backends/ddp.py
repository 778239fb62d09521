"""Plain data parallelism: every rank holds the whole model; the baseline the others are measured against."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from align.backends.report import ShardingReport


def trainer_args(plan: Any) -> dict[str, Any]:
    """DDP needs no extra trainer settings beyond telling it every parameter is used."""
    return {"ddp_find_unused_parameters": False}


def check_supported(plan: Any) -> None:
    """Every stage a pipeline can express runs under this backend."""


def model_kwargs(plan: Any) -> dict[str, Any]:
    """Models load whole on each rank."""
    return {}


def prepare(model: Any, plan: Any) -> Any:
    """The model as loaded: the trainer wraps it in DDP itself."""
    return model


def verify(model: Any, plan: Any) -> None:
    """Nothing is sharded, so there is nothing to prove."""


def callbacks(plan: Any, logs_dir: Path) -> list[Any]:
    """Record what each rank holds, as every backend does."""
    return [ShardingReport(logs_dir)]
