"""Checks that span more than one key: references, models, data files, and the `trl:` blocks.

They run after every stage has the right shape, so each check can trust the types it reads. Paths are
absolute by now (align.pipeline.file), so no check depends on the directory align runs in.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from align.cache import is_dir, link_loop
from align.config.spec import KINDS, MergeStage, Pipeline, RewardedStage, RewardStage, TrainingStage
from align.config.stage_parts import training_data_of, trl_of
from align.data.loading import split_ref
from align.data.overlap import held_out_problems
from align.data.row_checks import is_message
from align.data.scan import check_data, columns_problem, first_row
from align.data.shapes import Normalizer
from align.data.sources import absent_hub_data, data_refs, mixture_problems
from align.errors import Problem
from align.models.chat_templates import resolve_template
from align.models.loading import HUB_ID, absent_hub_model, has_chat_template, model_problem
from align.pipeline.eval_checks import eval_problems
from align.pipeline.graph import order, reference_target, references, strings
from align.pipeline.placement_checks import placement_problems
from align.pipeline.teacher_checks import teacher_problems
from align.pipeline.template_checks import coverage_problems
from align.rewards import args_problem, function_problem


def model_problems(pipeline: Pipeline) -> list[Problem]:
    """Each model a stage starts from exists (and runs no code of its own unless the pipeline allows it),
    and a merge stage reads an adapter."""
    problems = []
    allow = pipeline.allow_custom_code
    if (message := model_problem(pipeline.base_model, allow_custom_code=allow)) is not None:
        problems.append(Problem("base_model", message))
    for name, stage in pipeline.stages.items():
        value = stage.model
        target = reference_target(value) if value else None
        # a reference names no folder; a malformed one is reported by the reference check
        if value and "${" not in value and (message := model_problem(value, allow_custom_code=allow)):
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
    """Each data source exists and every row of it fits its stage kind (align.data.scan); then, where each
    does, the sources of a mixture can be mixed (align.data.sources) and no eval row is trained on
    (align.data.overlap)."""
    problems = []
    for name, stage in pipeline.stages.items():
        if not isinstance(stage, TrainingStage):
            continue
        kind, found = KINDS[stage.kind].data, []
        for path, ref, columns, columns_path in data_refs(stage.data, f"stages.{name}"):
            if link_loop(split_ref(ref)[0]):
                found.append(
                    Problem(path, f"{ref} is a symbolic link that leads back to itself (a symlink loop)")
                )
            elif columns and (message := columns_problem(ref, kind, columns)) is not None:
                found.append(Problem(columns_path, message))
            elif (message := check_data(ref, kind, path, columns)) is not None:
                found.append(Problem(path, message))
        problems += found or [
            *mixture_problems(stage.data, kind, f"stages.{name}"),
            *held_out_problems(stage.data, f"stages.{name}"),
        ]
    return problems


def root_folder(pipeline: Pipeline, name: str) -> Path | None:
    """The local model folder a stage's chain of references starts from (None: a builtin or a hub id)."""
    value, seen = pipeline.stage_model(name), {name}
    # a cycle of references is reported by the reference check; here it must not loop forever
    while (target := reference_target(value)) in pipeline.stages and target not in seen:
        seen.add(target)
        value = pipeline.stage_model(target)
    path = Path(value)
    if "${" in value or not path.is_absolute() or not is_dir(path):
        return None
    return path if model_problem(value, allow_custom_code=True) is None else None  # a model check says why


def template_problems(pipeline: Pipeline) -> list[Problem]:
    """Conversational rows are rendered by the tokenizer's chat template; a base model that has none
    (Llama-3-8B, Qwen2.5-7B base, Mistral-7B-v0.1) would fail in the worker, after the model loaded."""
    named = [("chat_template", pipeline.chat_template)]
    named += [
        (f"stages.{name}.chat_template", stage.chat_template) for name, stage in pipeline.stages.items()
    ]
    problems = []
    for where, value in named:
        try:
            resolve_template(value) if value else None
        except ValueError as err:
            problems.append(Problem(where, str(err)))
    for name, stage in pipeline.stages.items():
        folder = root_folder(pipeline, name) if isinstance(stage, TrainingStage) else None
        if folder is None or has_chat_template(folder) or pipeline.stage_chat_template(name):
            continue
        source = stage.data.sources[0]  # the sources of a mixture share one format
        row = first_row(source.path)
        values = Normalizer(source.columns)(row).values() if row else ()
        if any(isinstance(value, list) and value and all(map(is_message, value)) for value in values):
            problems.append(
                Problem(
                    f"stages.{name}.data.train",
                    f"its rows are conversations, but the model {folder} has no chat template to render "
                    "them (none in its tokenizer files): set `chat_template: chatml` (top level, or the "
                    "stage's; or a .jinja file, or a model folder to take one from), give text rows, or "
                    "start from a model that has one",
                )
            )
    return problems


@dataclass(frozen=True)
class CrossChecked:
    """What the checks across keys found: the reference graph (built here, once, and kept on the pipeline),
    the problems, the checks that wait on one (`ConfigError.waiting`), and the hub models this machine
    cannot load (`Pipeline.absent`)."""

    edges: dict[str, list[str]]
    problems: list[Problem]
    waiting: list[str]
    absent: list[Problem]


def cross_check(pipeline: Pipeline, named: list[str] | None = None) -> CrossChecked:
    """Every problem that spans keys: references and their order, models, data, rewards. `named`: every
    stage the file names, those left out of `pipeline` by their own problems too (their references are
    known, and wait for them). Each check runs whatever the others found, except where it reads what
    another refused: that check waits, and is named."""
    edges, problems = references(pipeline.stages, named)
    problems += order(edges)[1]
    problems += model_problems(pipeline)
    problems += data_problems(pipeline)
    problems += template_problems(pipeline)
    problems += coverage_problems(pipeline, {problem.path for problem in problems})
    problems += reward_problems(pipeline)
    problems += placement_problems(pipeline)
    problems += teacher_problems(pipeline)
    problems += vllm_problems(pipeline)
    problems += eval_problems(pipeline, reward_model_problems)
    problems += ignored_by_trl(pipeline)
    absent = absent_models(pipeline) + absent_hub_data(
        {name: training_data_of(stage) for name, stage in pipeline.stages.items()}
    )
    return CrossChecked(edges, problems, coverage_waiting(pipeline, problems), absent)


def coverage_waiting(pipeline: Pipeline, problems: list[Problem]) -> list[str]:
    """The template-coverage checks left to a stage's data problem (`coverage_problems`)."""
    return [
        f"stages.{name}.data's template coverage"
        for name, stage in pipeline.stages.items()
        if isinstance(stage, TrainingStage)
        and any(p.path.startswith(f"stages.{name}.data") for p in problems)
    ]


MODEL_VALUE = re.compile(
    r"base_model|stages\.[^.\[]+(\[[^\]]*\])?\.(model|teacher|teacher\.model|models\.[^.]+|rewards\[\d+\]\.model)"
)
"""The YAML paths whose value names a model (align.pipeline.file's PATH_FIELDS resolves the same)."""


def absent_models(pipeline: Pipeline) -> list[Problem]:
    """Each hub id the file names that this machine cannot load (`absent_hub_model`), once, at its first
    place."""
    named = [("base_model", pipeline.base_model)] + [
        pair
        for name, stage in pipeline.stages.items()
        for pair in strings(stage.model_dump(exclude_defaults=True), f"stages.{name}")
    ]
    found: dict[str, Problem] = {}
    for path, value in named:
        if MODEL_VALUE.fullmatch(path) and HUB_ID.fullmatch(value) and value not in found:
            if (message := absent_hub_model(value)) is not None:
                found[value] = Problem(path, message)
    return list(found.values())


IGNORED_BY_TRL = {
    ("dpo", "padding_free"): "the pinned TRL turns padding-free DPO off (it pads anyway, with a warning); "
    "drop it: DPO batches are padded",
}
"""`trl:` settings the pinned TRL accepts and then ignores: refused, so the run is the one the file says."""


def ignored_by_trl(pipeline: Pipeline) -> list[Problem]:
    return [
        Problem(f"stages.{name}.trl.{key}", message)
        for name, stage in pipeline.stages.items()
        for (kind, key), message in IGNORED_BY_TRL.items()
        if stage.kind == kind and trl_of(stage).get(key)
    ]


def vllm_problems(pipeline: Pipeline) -> list[Problem]:
    """TRL's `use_vllm` (GRPO, RLOO) generates with vLLM, an optional GPU-only package: without it the
    stage would fail in its worker after the models load, so it is refused here."""
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        return []
    message = (
        "vLLM is not installed here; it generates on GPUs only: `pip install vllm` on a GPU machine, or "
        "drop `use_vllm` (generation then runs in transformers, as by default)"
    )
    return [
        Problem(f"stages.{name}.trl.use_vllm", message)
        for name, stage in pipeline.stages.items()
        if trl_of(stage).get("use_vllm") is True
    ]


def reward_problems(pipeline: Pipeline) -> list[Problem]:
    """Rewards: shipped functions with fitting args, own code only when opted in, reward models from
    `reward` stages; and a reward stage's LoRA must merge into a plain model."""
    problems = []
    if pipeline.allow_custom_code:
        importable_from(pipeline.module_roots())
    for name, stage in pipeline.stages.items():
        where = f"stages.{name}"
        if isinstance(stage, RewardStage) and stage.lora is not None and stage.lora.load_in_4bit:
            message = "a reward stage merges its LoRA into model/, which a 4-bit base cannot take; drop it"
            problems.append(Problem(f"{where}.lora.load_in_4bit", message))
        if not isinstance(stage, RewardedStage):
            continue
        if "reward_weights" in stage.trl:
            problems.append(Problem(f"{where}.trl.reward_weights", "set `weight:` on each of `rewards:`"))
        for index, reward in enumerate(stage.rewards):
            path = f"{where}.rewards[{index}]"
            if reward.model is not None:
                problems += reward_model_problems(pipeline, reward.model, f"{path}.model")
            elif (message := function_problem(reward.function, pipeline.allow_custom_code)) is not None:
                problems.append(Problem(f"{path}.function", message))
            elif (message := args_problem(reward.function, reward.args)) is not None:
                problems.append(Problem(f"{path}.args", message))
    return problems


def reward_model_problems(pipeline: Pipeline, value: str, path: str) -> list[Problem]:
    """A reward model is a reward stage's output, or a folder or hub id (its head is checked at run time)."""
    target = reference_target(value)
    if target is None:
        allow = pipeline.allow_custom_code
        # a malformed reference is reported by the reference check
        message = None if "${" in value else model_problem(value, allow_custom_code=allow)
        return [] if message is None else [Problem(path, message)]
    source = pipeline.stages.get(target)
    if source is None or isinstance(source, RewardStage):
        return []  # an unknown stage is reported by the reference check
    return [
        Problem(
            path,
            f"refers to stage '{target}', a {source.kind} stage; a reward model comes from a stage "
            "with `kind: reward`",
        )
    ]


def importable_from(roots: list[str]) -> None:
    """Own reward functions import, when validated, from where the workers will import them."""
    sys.path.extend(root for root in roots if root not in sys.path)
