"""An eval stage's cross-key checks: its named models exist, its rewards are usable (as an RL stage's are),
and every row of its prompts file fits (align.data.scan)."""

from __future__ import annotations

import difflib

from align.config.eval_settings import LmEvalSpec
from align.config.spec import EvalStage, Pipeline
from align.data.scan import check_data, columns_problem
from align.errors import Problem
from align.models.loading import model_problem
from align.pipeline.graph import reference_target
from align.rewards import args_problem, function_problem


def eval_problems(pipeline: Pipeline, reward_model_problems) -> list[Problem]:
    """Every problem of every eval stage; `reward_model_problems` is the RL stages' own check."""
    problems = []
    allow = pipeline.allow_custom_code
    for name, stage in pipeline.stages.items():
        if not isinstance(stage, EvalStage):
            continue
        where = f"stages.{name}"
        for model, value in stage.models.items():
            if reference_target(value) is None and "${" not in value:
                if (message := model_problem(value, allow_custom_code=allow)) is not None:
                    problems.append(Problem(f"{where}.models.{model}", message))
        for index, reward in enumerate(stage.rewards):
            path = f"{where}.rewards[{index}]"
            if reward.model is not None:
                problems += reward_model_problems(pipeline, reward.model, f"{path}.model")
            elif (message := function_problem(reward.function, allow)) is not None:
                problems.append(Problem(f"{path}.function", message))
            elif (message := args_problem(reward.function, reward.args)) is not None:
                problems.append(Problem(f"{path}.args", message))
        if stage.lm_eval is not None and (problem := lm_eval_problem(stage.lm_eval, where)) is not None:
            problems.append(problem)
        if stage.data is not None:
            data, path = stage.data, f"{where}.data.prompts"
            if data.columns and (message := columns_problem(data.prompts, "prompts", data.columns)):
                problems.append(Problem(f"{where}.data.columns", message))
            elif (message := check_data(data.prompts, "prompts", path, data.columns)) is not None:
                problems.append(Problem(path, message))
    return problems


def lm_eval_problem(spec: LmEvalSpec, where: str, manager=None) -> Problem | None:
    """The first task lm-eval does not know, with the closest names it does; lm-eval indexes its few
    thousand task YAMLs first (about 7 s), so only a pipeline that names tasks pays it."""
    if manager is None:
        from lm_eval.tasks import TaskManager

        manager = TaskManager(include_path=spec.include_path, include_defaults=spec.include_path is None)
    unknown = [task for task in spec.tasks if task not in manager.all_tasks]
    if not unknown:
        return None
    where_from = spec.include_path or "lm-eval's own tasks"
    close = difflib.get_close_matches(unknown[0], manager.all_tasks, n=3)
    hint = f" (close: {', '.join(close)})" if close else ""
    return Problem(
        f"{where}.lm_eval.tasks",
        f"no task {unknown[0]!r} in {where_from}{hint}; name a task of that folder's YAMLs (its `task:` "
        "key), or set lm_eval.include_path to the folder that holds it",
    )
