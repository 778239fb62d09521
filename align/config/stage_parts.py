"""What a stage has, by its kind: each block only some kinds take (`lora:`, `trl:`, `data:`, `rewards:`,
`teacher:`, an eval stage's `models:`), read from the type that declares it. A kind without the block gets
its empty value, so no caller probes a stage with `getattr` and a misspelt name fails loudly."""

from __future__ import annotations

from typing import Any

from align.config.data_settings import DataSpec
from align.config.eval_settings import EvalDataSpec
from align.config.reward import RewardSpec
from align.config.spec import DistillStage, EvalStage, LoraSpec, RewardedStage, StageBase, TrainingStage
from align.config.teacher import TeacherSpec


def lora_of(stage: StageBase) -> LoraSpec | None:
    """A training stage's `lora:` block (None: full parameters, or a kind that trains nothing)."""
    return stage.lora if isinstance(stage, TrainingStage) else None


def trl_of(stage: StageBase) -> dict[str, Any]:
    """A training stage's `trl:` block; empty for a kind that passes nothing to TRL."""
    return stage.trl if isinstance(stage, TrainingStage) else {}


def data_of(stage: StageBase) -> DataSpec | EvalDataSpec | None:
    """A training stage's `data:` (its train and held-out rows), an eval stage's prompts, or None."""
    return stage.data if isinstance(stage, TrainingStage | EvalStage) else None


def training_data_of(stage: StageBase) -> DataSpec | None:
    """A training stage's `data:` (with `train`), None for every other kind (an eval stage's prompts too)."""
    return stage.data if isinstance(stage, TrainingStage) else None


def rewards_of(stage: StageBase) -> list[RewardSpec]:
    """An online RL or eval stage's `rewards:`; empty for every other kind."""
    return stage.rewards if isinstance(stage, RewardedStage | EvalStage) else []


def teacher_of(stage: StageBase) -> TeacherSpec | None:
    """A distill stage's `teacher:`; None for every other kind."""
    return stage.teacher if isinstance(stage, DistillStage) else None


def eval_models_of(stage: StageBase) -> dict[str, str]:
    """An eval stage's `models:` (name -> model value); empty for every other kind."""
    return stage.models if isinstance(stage, EvalStage) else {}
