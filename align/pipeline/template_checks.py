"""Does the chat template a stage trains through render every part of its rows? Which template that is
(the stage's `chat_template:` or the pipeline's, else the one its model carries: the nearest stage up its
chain of `${stages.X.output}` that sets one, else the starting model's own), and the refusal with the way
out. The rendering itself is align.data.template_coverage.
"""

from __future__ import annotations

from pathlib import Path

from align.cache import is_dir
from align.config.spec import Pipeline, TrainingStage
from align.data.row_checks import is_message
from align.data.scan import first_row
from align.data.shapes import Normalizer, RowProblem
from align.data.sources import data_refs
from align.data.template_coverage import template_coverage
from align.errors import ModelError, Problem
from align.models.chat_templates import ChatTemplate, folder_template, resolve_template, template_variables
from align.models.loading import BUILTIN_MODELS, resolve_model
from align.pipeline.graph import reference_target

TOOLS_FIX = (
    "set `chat_template: chatml-tools` (top level, or the stage's): ChatML that renders tool calls, tool "
    "results and the `tools` schemas (the Hermes/Qwen2.5 form), or give a .jinja file that renders them"
)
FIX = (
    "give the stage a template that renders every turn (`chat_template:` a builtin such as chatml, a .jinja "
    "file or a model folder), or drop from the rows what it leaves out"
)


def coverage_problems(pipeline: Pipeline, checked: set[str]) -> list[Problem]:
    """Each training stage's conversational rows, rendered through its template, keep every part; a stage
    whose data already has a problem (a path in `checked`) is left to that problem."""
    problems = []
    for name, stage in pipeline.stages.items():
        if not isinstance(stage, TrainingStage) or any(p.startswith(f"stages.{name}.data") for p in checked):
            continue
        sources = [
            (path.removesuffix(".path"), ref, columns)
            for path, ref, columns, _ in data_refs(stage.data, f"stages.{name}")
            if path.startswith(f"stages.{name}.data.train") and conversational(ref, columns)
        ]
        template = stage_template(pipeline, name) if sources else None
        if template is None:
            continue
        text, source, variables = template
        for path, ref, columns in sources:
            if (dropped := template_coverage(ref, columns, text, source, variables)) is not None:
                fix = TOOLS_FIX if dropped.tools and "chatml-tools (builtin)" not in source else FIX
                problems.append(Problem(path, f"{dropped.message}; {fix}"))
    return problems


def conversational(ref: str, columns: dict[str, str]) -> bool:
    """Whether a file's first row, renamed and converted, holds conversations (only those meet a template)."""
    row = first_row(ref)
    try:
        values = Normalizer(columns)(row).values() if row else ()
    except RowProblem:
        return False
    return any(isinstance(value, list) and value and all(map(is_message, value)) for value in values)


def stage_template(pipeline: Pipeline, name: str) -> tuple[str, str, dict[str, str]] | None:
    """The template a stage renders its rows with, where it comes from, and the tokens its tokenizer passes
    it; None when it cannot be read here (a hub model, or none at all: align.pipeline.checks says so)."""
    seen = set()
    while name not in seen:
        seen.add(name)
        if value := pipeline.stage_chat_template(name):
            try:
                template: ChatTemplate = resolve_template(value)
            except ValueError:
                return None  # reported by the template check
            return template.text, f"the chat template {template.source}", {}
        model = pipeline.stage_model(name)
        if (target := reference_target(model)) not in pipeline.stages:
            break
        name = target
    folder = model_folder(model)
    text = folder_template(folder) if folder is not None else None
    if text is None:
        return None
    return text, f"{model}'s own chat template (from its tokenizer files)", template_variables(folder)


def model_folder(model: str) -> Path | None:
    """The local folder of a starting model; a builtin is built here once, as its first stage would."""
    if model in BUILTIN_MODELS:
        try:
            return Path(resolve_model(model))
        except ModelError:
            return None  # reported by the model check
    path = Path(model)
    return path if "${" not in model and path.is_absolute() and is_dir(path) else None
