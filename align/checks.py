"""Checks that span more than one key: references, models, data files, and the `trl:` blocks.

They run after every stage has the right shape, so each check can trust the types it reads.
"""

from __future__ import annotations

from align.data import check_data
from align.errors import Problem
from align.graph import order, reference_target, references
from align.models import model_problem
from align.spec import MergeStage, Pipeline, TrainingStage

DATA_KIND = {"sft": "sft", "dpo": "dpo", "reward": "reward"}


def model_problems(pipeline: Pipeline) -> list[Problem]:
    """Each model a stage starts from exists, and a merge stage reads an adapter."""
    problems = []
    if (message := model_problem(pipeline.base_model)) is not None:
        problems.append(Problem("base_model", message))
    for name, stage in pipeline.stages.items():
        value = stage.model
        target = reference_target(value) if value else None
        malformed = value is not None and "${" in value  # reported by the reference check
        if value and target is None and not malformed and (message := model_problem(value)) is not None:
            problems.append(Problem(f"stages.{name}.model", message))
        if isinstance(stage, MergeStage) and (target is None or target in pipeline.stages):
            source = pipeline.stages.get(target) if target else None
            if not isinstance(source, TrainingStage) or source.lora is None:
                problems.append(
                    Problem(
                        f"stages.{name}.model",
                        "a merge stage needs an adapter: refer to a "
                        "stage that trains with `lora:`, as ${stages.NAME.output}",
                    )
                )
    return problems


def data_problems(pipeline: Pipeline) -> list[Problem]:
    """Each data file exists and has the columns its stage kind needs (reads a row, not the file)."""
    problems = []
    for name, stage in pipeline.stages.items():
        if not isinstance(stage, TrainingStage):
            continue
        for split in ("train", "eval"):
            ref = getattr(stage.data, split)
            path = f"stages.{name}.data.{split}"
            if ref is not None and (message := check_data(ref, DATA_KIND[stage.kind], path)) is not None:
                problems.append(Problem(path, message))
    return problems


def cross_check(pipeline: Pipeline) -> list[Problem]:
    """Every problem that spans keys: references and their order, models, data."""
    edges, problems = references(pipeline.stages)
    if not problems:
        problems += order(edges)[1]
    problems += model_problems(pipeline)
    problems += data_problems(pipeline)
    problems += backend_problems(pipeline)
    return problems


def backend_problems(pipeline: Pipeline) -> list[Problem]:
    """A user's own DeepSpeed JSON is read now, not after Ray has started the stage."""
    from align.backends.zero2 import user_config
    from align.errors import ConfigError

    problems = []
    for name, stage in pipeline.stages.items():
        if stage.zero2.config is None:
            continue
        try:
            user_config(stage.zero2.config, f"stages.{name}.zero2.config")
        except ConfigError as err:
            problems += err.problems
    return problems
