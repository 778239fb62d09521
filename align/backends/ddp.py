"""Plain data parallelism: every rank holds the whole model; the baseline the others are measured against.

`DDP` is also the set of defaults a backend that replicates the weights keeps (ZeRO-2 extends it).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from align.errors import Problem
from align.models.memory import Workload, estimate

if TYPE_CHECKING:
    from align.backends.base import PlannedStage
    from align.config.spec import StageBase
    from align.models.architectures import Architecture


class DDP:
    """Whole models on every rank, wrapped in DDP by the Trainer itself."""

    name = "ddp"
    titles = {"ddp": "DDP"}
    policy_held = "replicated on every rank"
    frozen_sharded = False
    keeps_fp32_master = False  # fp32 weights, autocast by the Trainer

    def problems(self, stage: StageBase, where: str, workers: int, precision: str) -> list[Problem]:
        return []

    def offloads_optimizer(self, stage: StageBase) -> bool:
        return False

    def needs_process_group(self, workers: int) -> bool:
        """One rank has nothing to synchronize: it trains as a plain TRL script, unwrapped (a rank in a
        process group of one was wrapped in DDP by Accelerate: 1.2x the step, docs/performance.md)."""
        return workers > 1

    def estimates(self, arch: Architecture, work: Workload, workers: int, stage: StageBase) -> dict:
        return {self.name: estimate(arch, work, backend=self.name, world_size=workers)}

    def option(self, stage: StageBase) -> str:
        return self.name

    def model_kwargs(self, plan: PlannedStage) -> dict[str, Any]:
        return {}

    def prepare(self, model: Any, plan: PlannedStage) -> Any:
        return model

    def trainer_args(self, plan: PlannedStage) -> dict[str, Any]:
        """Every parameter is used: DDP need not search for unused ones."""
        return {"ddp_find_unused_parameters": False}

    def callbacks(self, plan: PlannedStage, logs_dir: Path) -> list[Any]:
        from align.backends.sharding_report import ShardingReport

        return [ShardingReport(logs_dir)]

    def verify(self, model: Any, plan: PlannedStage) -> None:
        """Nothing is sharded, so there is nothing to prove."""
