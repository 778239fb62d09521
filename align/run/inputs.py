"""What a stage reads, resolved on the driver from the records of the stages before it, and the
fingerprint that says whether its published output is still up to date."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from align.config.stage_parts import training_data_of
from align.data.hub import HUB_PREFIX, resolved
from align.data.loading import NO_EVAL, data_identity
from align.errors import AlignError, DataError
from align.fingerprint import digest
from align.models.loading import resolve_model
from align.pipeline.graph import reference_target
from align.planning.launch import Launch
from align.planning.plan import ModelInput, StageInputs, StagePlan
from align.records import Output, StageResult
from align.run import records


def model_input(value: str, field: str, folders: dict[str, Path]) -> ModelInput:
    """A model value resolved: a builtin's cached folder, a local folder's absolute path, a hub id, or an
    upstream stage's output read from its record (a base with its chain of adapters)."""
    target = reference_target(value)
    if target is None:
        return ModelInput(resolve_model(value, field))
    record = records.read_stage(folders[target])
    if record is None or not record.succeeded or record.output is None:
        raise AlignError(f"{field}: stage '{target}' has no finished output to read")
    return ModelInput(record.output.base, tuple(record.output.adapters))


def resolve_inputs(stage: StagePlan, folders: dict[str, Path]) -> StageInputs:
    """Every folder a stage reads, resolved here on the driver so that no stage imports `run/`."""
    model = model_input(stage.model_source, f"{stage.where}.model", folders)
    reward_models = {
        index: model_input(reward.model, f"{stage.where}.rewards[{index}].model", folders).base
        for index, reward in enumerate(stage.rewards)
        if reward.model is not None
    }
    models = {  # an eval stage's, each resolved as a stage's own model is
        name: model_input(value, f"{stage.where}.models.{name}", folders)
        for name, value in stage.eval_models.items()
    }
    teacher = None  # a distill stage's, resolved as its own model is
    if stage.teacher is not None:
        teacher = model_input(stage.teacher.model, f"{stage.where}.teacher", folders)
    return StageInputs(model, reward_models, models, teacher)


def pinned(launch: Launch) -> Launch:
    """The launch with each hub dataset its stage reads pinned to the commit the hub serves now (or, with no
    hub, the one cached here): its fingerprint and record hold that commit, so a re-pushed dataset reruns the
    stage, and its workers load the very rows that were fingerprinted."""
    data = training_data_of(launch.stage)
    if data is None:  # an eval stage's prompts are read as they are
        return launch

    def pin(ref: str | None, field: str) -> str | None:
        if ref is None or not ref.startswith(HUB_PREFIX):
            return ref
        try:
            return str(resolved(ref))
        except DataError as error:
            raise DataError(f"{launch.where}.data.{field}: {error}") from None

    if data.is_mixture:
        train = [
            source.model_copy(update={"path": pin(source.path, f"train[{index}].path")})
            for index, source in enumerate(data.train)
        ]
    else:
        train = pin(data.train, "train")
    data = data.model_copy(update={"train": train, "eval": pin(data.eval, "eval")})
    return replace(launch, stage=launch.stage.model_copy(update={"data": data}))


def fingerprint(launch: Launch, folders: dict[str, Path]) -> str:
    """A hash of the resolved stage config and of its inputs: models, upstream records, data bytes."""
    stage, inputs, config = launch.plan, launch.inputs, launch.stage
    upstream_prints = {name: records.read_stage(folders[name]).fingerprint for name in stage.upstream}
    data = training_data_of(config)
    if stage.kind == "eval":  # an eval stage's prompts
        splits = (("prompts", stage.data.prompts),) if stage.data is not None else ()
    else:
        held_out = data.eval if data and data.eval != NO_EVAL else None
        splits = (("train", data.train), ("eval", held_out)) if data else ()
    where = f"{stage.where}.data"
    own_model = reference_target(stage.model_source) is None  # an upstream's is in its fingerprint
    template = {"chat_template": stage.chat_template.text} if stage.chat_template else {}  # top level's too
    teacher = {}  # a distill stage's teacher, unless an upstream's output (that is in its fingerprint)
    if inputs.teacher is not None and reference_target(stage.teacher.model) is None:
        teacher["teacher"] = records.model_identity(inputs.teacher.base)
    named = {  # an eval stage's models that are not an upstream's output (those are in its fingerprint)
        name: records.model_identity(model.base)
        for name, model in inputs.models.items()
        if reference_target(stage.eval_models[name]) is None
    }
    return digest(
        {
            **template,
            **({"models": named} if named else {}),
            **teacher,
            "stage": config.model_dump(mode="json"),
            "backend": stage.backend,
            "workers": stage.workers,
            "precision": stage.precision,
            "trainable_dtype": stage.trainable_dtype,  # bf16 once meant bf16 weights: such runs train again
            "seed": stage.seed,
            "model": records.model_identity(inputs.model.base) if own_model else None,
            "reward_models": {i: records.model_identity(f) for i, f in inputs.reward_models.items()},
            "upstream": upstream_prints,
            "data": {split: identity(ref, f"{where}.{split}") for split, ref in splits if ref},
        }
    )


def identity(ref: Any, field: str) -> Any:
    """What says a split's data changed: its ref's identity, or each source's for a mixture (their shares
    and renames are in the stage's own config)."""
    if isinstance(ref, str):
        return data_identity(ref, field)
    return [data_identity(source.path, f"{field}[{index}].path") for index, source in enumerate(ref)]


def output_of(result: StageResult, inputs: ModelInput, folder: Path) -> Output:
    """What the next stage reads: a base with its chain of adapters, or a whole model folder."""
    path = str(folder / result.output)
    if result.output == "adapter":
        return Output(kind="adapter", path=path, base=inputs.base, adapters=[*inputs.adapters, path])
    return Output(kind="model", path=path, base=path)
