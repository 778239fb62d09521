"""Stage runners, one module per kind, each with `run(StageContext) -> StageResult` (the kinds table in
align/config/spec.py names each runner). Imports planning, backends, trainers and below; never run/."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

from align.config.spec import KINDS

if TYPE_CHECKING:
    from align.records import StageResult
    from align.stages.context import StageContext


def runner_for(kind: str) -> ModuleType:
    """The runner module of a stage kind, imported only in the worker that needs it."""
    return importlib.import_module(KINDS[kind].runner)


def run_seeded(ctx: StageContext) -> StageResult:
    """Seed python, numpy and torch (CUDA included) from the stage's seed, then run its kind's runner.

    torch starts every process with a random seed, so whatever is random before a trainer seeds itself (a
    score head, LoRA adapters, the held-out slice's order) would differ from run to run without this."""
    from transformers import set_seed

    set_seed(ctx.plan.seed)
    return runner_for(ctx.plan.kind).run(ctx)
