"""The Ray driver: a thin controller that walks the plan and runs each stage on warm Ray workers.

It reads like single-process code: hold the pipeline's output folder, then for each stage in order,
skip it if its record matches, else launch it (resuming an earlier attempt's checkpoint, retrying lost
workers) and publish its folder when it ends.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from align.config.secrets import redact
from align.data.loading import NO_EVAL
from align.errors import AlignError, Interrupted, StageFailed
from align.fingerprint import digest
from align.models.loading import resolve_model
from align.pipeline.graph import downstream, reference_target, upstream
from align.planning.plan import ModelInput, Plan, StageInputs, StagePlan, priced_at_launch
from align.run import records
from align.run.disk import check_space, probe_writable
from align.run.launch import LostWorkers, connect, connected, disconnect, ray_launch, worker_env
from align.run.lock import RunLock, run_lock
from align.run.worker import RESULT
from align.run.workers import GroupShape, WarmWorkers
from align.stages.checkpoints import latest_complete, remove_torn

Event = Callable[[str], None]

Launcher = Callable[[Plan, StagePlan, Path, Path | None], dict[str, Any]]
"""Runs one attempt at a stage (its plan carries its resolved inputs) into a scratch folder, from a
checkpoint folder when one is given; returns rank 0's result. Raises LostWorkers when a retry may help."""


@dataclass(frozen=True)
class Outcome:
    """How one stage ended in this run: ran, or skipped because its record matched."""

    stage: str
    status: str  # "ran" | "skipped"
    folder: Path
    seconds: float
    metrics: dict[str, float]


def model_input(value: str, field: str, folders: dict[str, Path]) -> ModelInput:
    """A model value resolved: a builtin's cached folder, a local folder's absolute path, a hub id, or an
    upstream stage's output read from its record (a base with its chain of adapters)."""
    target = reference_target(value)
    if target is None:
        return ModelInput(resolve_model(value, field))
    record = records.read_record(folders[target])
    if record is None or record.get("status") != "succeeded":
        raise AlignError(f"{field}: stage '{target}' has no finished output to read")
    output = record["output"]
    return ModelInput(output["base"], tuple(output["adapters"]))


def resolve_inputs(stage: StagePlan, folders: dict[str, Path]) -> StageInputs:
    """Every folder a stage reads, resolved here on the driver so that no stage imports `run/`."""
    model = model_input(stage.model_source, f"{stage.where}.model", folders)
    reward_models = {
        index: model_input(reward.model, f"{stage.where}.rewards[{index}].model", folders).base
        for index, reward in enumerate(getattr(stage.stage, "rewards", []))
        if reward.model is not None
    }
    models = {  # an eval stage's, each resolved as a stage's own model is
        name: model_input(value, f"{stage.where}.models.{name}", folders)
        for name, value in getattr(stage.stage, "models", {}).items()
    }
    return StageInputs(model, reward_models, models)


def fingerprint(stage: StagePlan, folders: dict[str, Path]) -> str:
    """A hash of the resolved stage config and of its inputs: models, upstream records, data bytes."""
    from align.data.loading import data_identity

    upstream_prints = {name: records.read_record(folders[name])["fingerprint"] for name in stage.upstream}
    data = getattr(stage.stage, "data", None)
    if prompts := getattr(data, "prompts", None):  # an eval stage's
        splits = (("prompts", prompts),)
    else:
        held_out = data.eval if data and data.eval != NO_EVAL else None
        splits = (("train", data.train), ("eval", held_out)) if data else ()
    inputs = stage.inputs
    own_model = reference_target(stage.model_source) is None  # an upstream's is in its fingerprint
    template = {"chat_template": stage.chat_template.text} if stage.chat_template else {}  # top level's too
    named = {  # an eval stage's models that are not an upstream's output (those are in its fingerprint)
        name: records.model_identity(model.base)
        for name, model in inputs.models.items()
        if reference_target(stage.stage.models[name]) is None
    }
    return digest(
        {
            **template,
            **({"models": named} if named else {}),
            "stage": stage.stage.model_dump(mode="json"),
            "backend": stage.backend,
            "workers": stage.workers,
            "precision": stage.precision,
            "trainable_dtype": stage.trainable_dtype,  # bf16 once meant bf16 weights: such runs train again
            "seed": stage.seed,
            "model": records.model_identity(inputs.model.base) if own_model else None,
            "reward_models": {i: records.model_identity(f) for i, f in inputs.reward_models.items()},
            "upstream": upstream_prints,
            "data": {
                split: data_identity(ref, f"{stage.where}.data.{split}") for split, ref in splits if ref
            },
        }
    )


def output_of(result: dict[str, Any], inputs: ModelInput, folder: Path) -> dict[str, Any]:
    """What the next stage reads: a base with its chain of adapters, or a whole model folder."""
    path = str(folder / result["output"])
    if result["output"] == "adapter":
        return {"kind": "adapter", "path": path, "base": inputs.base, "adapters": [*inputs.adapters, path]}
    return {"kind": "model", "path": path, "base": path, "adapters": []}


def memory_plan(stage: StagePlan) -> list[dict[str, Any]] | None:
    """The plan's per-rank bytes under the stage's backend, row by row as `align plan` shows them, so that
    `align report` can set them beside the peaks each rank measured; None without an architecture."""
    if stage.memory is None:
        return None
    return [{"what": label, "device": device, "host": host} for label, device, host in stage.memory.rows()]


def run_stage(
    plan: Plan,
    stage: StagePlan,
    stamp: str,
    folder: Path,
    launch: Launcher,
    *,
    restart: bool,
    on_event: Event,
) -> dict[str, Any]:
    """Run one stage into a scratch folder and publish it with its record; keep it aside on failure.

    An earlier attempt with the same fingerprint (a killed or interrupted run) is continued from its
    latest complete checkpoint, unless `restart`; a lost worker is retried up to `max_failures`."""
    inputs = stage.inputs.model
    record: dict[str, Any] = {
        "pipeline": plan.pipeline.name,
        "stage": stage.name,
        "kind": stage.kind,
        "fingerprint": stamp,
        "config": redact(stage.stage.model_dump(mode="json")),
        "resolved": {
            "backend": stage.backend,
            "backend_reason": stage.backend_reason,
            "workers": stage.workers,
            "precision": stage.precision,
            "trainable_dtype": stage.trainable_dtype,
            "seed": stage.seed,
            "model": inputs.base,
            "adapters": list(inputs.adapters),
        },
        "memory_plan": memory_plan(stage),
        "versions": records.versions(),
        "git_sha": records.git_sha(),
        "started": time.time(),
    }
    earlier = None if restart else records.resumable(folder, stamp)
    scratch = records.start_attempt(folder, record, earlier[0] if earlier else None)
    attempts: list[dict[str, Any]] = []
    try:
        result = attempt_until_done(plan, stage, scratch, launch, attempts, on_event)
    except (AlignError, StageFailed, KeyboardInterrupt, OSError) as err:
        status = "interrupted" if isinstance(err, KeyboardInterrupt) else "failed"
        record.update(status=status, ended=time.time(), error=str(err), attempts=attempts)
        raise with_kept_folder(err, stage.name, records.keep_failed(scratch, folder, record)) from None
    (scratch / RESULT).unlink()
    for leftover in (path for path in scratch.iterdir() if path.is_dir() and not any(path.iterdir())):
        leftover.rmdir()  # e.g. checkpoints/ when the stage saved none
    resumed_from = attempts[-1]["resumed_from"]
    record.update(
        status="succeeded",
        ended=time.time(),
        metrics=result["metrics"],
        samples=result.get("samples", []),
        ranks=result.get("ranks", []),  # where each rank ran: node, GPUs, local rank
        output=output_of(result, inputs, folder),
        resumed_from=resumed_from,
        steps_trained=None if result.get("steps") is None else result["steps"] - (resumed_from or 0),
        retries=len(attempts) - 1,
        attempts=attempts,
    )
    records.publish(scratch, folder, record)
    records.clear_attempts(folder)
    return record


def attempt_until_done(
    plan: Plan,
    stage: StagePlan,
    scratch: Path,
    launch: Launcher,
    attempts: list[dict[str, Any]],
    on_event: Event,
) -> dict[str, Any]:
    """Launch the stage, each time from its latest complete checkpoint, until it ends or has lost workers
    more than `max_failures` times. Each attempt is noted in `attempts` (where it started, how it ended)."""
    while True:
        torn = remove_torn(scratch)
        checkpoint = latest_complete(scratch)
        attempts.append({"started": time.time(), "resumed_from": checkpoint[0] if checkpoint else None})
        if torn:
            on_event(f"[{stage.name}] set aside unfinished checkpoint(s) at step {', '.join(map(str, torn))}")
        if checkpoint:
            on_event(f"[{stage.name}] resuming from step {checkpoint[0]} ({checkpoint[1]})")
        try:
            return launch(plan, stage, scratch, checkpoint[1] if checkpoint else None)
        except LostWorkers as err:
            attempts[-1]["error"] = str(err)
            retries = len(attempts) - 1
            if retries >= stage.max_failures:
                limit = f"max_failures: {stage.max_failures}"
                raise StageFailed(f"{err}; gave up after {retries} retries ({limit})") from None
            on_event(
                f"[{stage.name}] {err}; retry {retries + 1} of {stage.max_failures}, from the last checkpoint"
            )


def with_kept_folder(err: BaseException, stage: str, kept: Path) -> BaseException:
    """The error to show, naming the folder its partial outputs (and the worker logs) were kept in."""
    if isinstance(err, KeyboardInterrupt):
        checkpoint = latest_complete(kept)
        where = (
            f"checkpoint at step {checkpoint[0]}" if checkpoint else "no checkpoint yet, so it starts over"
        )
        return Interrupted(
            getattr(err, "signum", Interrupted.received), f"stage '{stage}' stopped ({where}); kept in {kept}"
        )
    if isinstance(err, OSError):
        return AlignError(f"{err.filename or kept}: {err.strerror}; partial outputs kept in {kept}")
    rank = getattr(err, "rank", None)
    log = f"; full log: {kept / 'logs' / f'worker-{rank}.log'}" if rank is not None else ""
    return type(err)(f"{err}\n(partial outputs kept in {kept}{log})")


def selected_stages(plan: Plan, only: list[str], force: list[str]) -> tuple[set[str], set[str]]:
    """Stages to consider (the named ones and what they need) and stages to rerun regardless."""
    unknown = [name for name in [*only, *force] if name not in plan.stages]
    if unknown:
        raise AlignError(f"unknown stage {unknown[0]!r}; stages: {', '.join(plan.order)}")
    wanted = upstream(plan.edges, set(only)) if only else set(plan.order)
    return wanted, downstream(plan.edges, set(force))


def run_plan(
    plan: Plan,
    *,
    only: list[str] = (),
    force: list[str] = (),
    restart: list[str] = (),
    address: str | None = None,
    verbose: bool = False,
    on_event: Event = lambda _: None,
    on_progress: Callable[[str, dict[str, Any]], None] = lambda *_: None,
    launch: Launcher | None = None,
    command: str = "align run",
) -> list[Outcome]:
    """Run (or skip) each selected stage in dependency order; a changed stage reruns its dependents.

    The pipeline's output folder is held for the whole run (a second run is refused) and checked
    writable first. `launch` runs a stage; by default on the run's warm Ray workers (`ray_launch`)."""
    wanted, forced = selected_stages(plan, list(only), [*force, *restart])
    root = plan.pipeline.defaults.output_root
    folders = {name: records.stage_dir(root, plan.pipeline.name, name) for name in plan.order}
    pipeline_folder = records.pipeline_dir(root, plan.pipeline.name)
    probe_writable(pipeline_folder)
    outcomes = []
    with (
        run_lock(pipeline_folder, command) as lock,
        ray_launcher(plan, lock, address, verbose, on_event, on_progress) as (ray, start_ray),
    ):
        if lock.stopped:
            on_event(f"stopped {len(lock.stopped)} process(es) left running by a run that was killed")
        launch = launch or ray
        for name in (n for n in plan.order if n in wanted):
            stage = replace(plan.stages[name], inputs=resolve_inputs(plan.stages[name], folders))
            stamp = fingerprint(stage, folders)
            existing = records.read_record(folders[name])
            if (
                name not in forced
                and existing
                and existing.get("status") == "succeeded"
                and existing.get("fingerprint") == stamp
            ):
                on_event(f"[{name}] skipped: up to date ({folders[name] / records.RECORD})")
                outcomes.append(Outcome(name, "skipped", folders[name], 0.0, existing.get("metrics", {})))
                continue
            stage = priced_at_launch(plan.pipeline, stage)
            check_space(stage, pipeline_folder)
            if launch is ray:
                start_ray(stage)  # its one line (which Ray) before the first stage's
            on_event(f"[{name}] running {stage.kind} on {stage.workers} worker(s), backend {stage.backend}")
            record = run_stage(
                plan, stage, stamp, folders[name], launch, restart=name in restart, on_event=on_event
            )
            seconds = record["ended"] - record["started"]
            on_event(f"[{name}] done in {seconds:.1f}s -> {folders[name]}")
            outcomes.append(Outcome(name, "ran", folders[name], seconds, record["metrics"]))
    return outcomes


@contextmanager
def ray_launcher(
    plan: Plan,
    lock: RunLock,
    address: str | None,
    verbose: bool,
    on_event: Event,
    on_progress: Callable[[str, dict[str, Any]], None],
) -> Iterator[tuple[Launcher, Callable[[StagePlan], None]]]:
    """`ray_launch` on the run's warm workers (one group, kept across stages of its shape), noting the
    processes of the embedded Ray under the run's lock, so that a later run can stop them should this
    driver be killed. Ray starts with the first stage that runs (a run that skips every stage never
    starts it), says which Ray it is in one line, and stops, with the workers, before the run's lock is
    released. A new group first proves that every rank reads the output root."""
    workers = WarmWorkers(worker_env(plan.pipeline.module_roots()), on_event)
    embedded = True

    def start(stage: StagePlan) -> None:
        nonlocal embedded
        if not connected():
            messages = records.pipeline_dir(plan.pipeline.defaults.output_root, plan.pipeline.name)
            try:
                embedded, which = connect(address, verbose, messages / "ray-messages.log")
            except Interrupted as err:
                where = f"stopped while Ray started, before stage '{stage.name}' (earlier stages are kept)"
                raise Interrupted(err.signum, where) from None
            on_event(which)

    def launch(plan: Plan, stage: StagePlan, scratch: Path, resume: Path | None) -> dict[str, Any]:
        start(stage)
        shape = GroupShape.of(stage, plan.hardware.accelerator, embedded)
        fresh = workers.group is None or workers.group.stopped or workers.group.shape != shape
        group = workers.group_for(shape, stage.name)
        lock.note_processes()
        if fresh:
            check_shared(group, scratch.parent)
        result = ray_launch(
            group,
            stage,
            scratch,
            resume,
            verbose=verbose,
            on_progress=lambda progress: on_progress(stage.name, progress),
        )
        return {**result, "ranks": group.placement}

    try:
        yield launch, start
    finally:
        workers.stop()
        disconnect()


def check_shared(group: Any, folder: Path) -> None:
    """Every rank must see the output root: a rank on a node without it would write where nobody reads."""
    probe, expected = folder / f".align-probe-{uuid.uuid4().hex}", uuid.uuid4().hex
    probe.write_text(expected)
    try:
        unreadable = group.unreadable(str(probe), expected)
    finally:
        probe.unlink(missing_ok=True)
    if unreadable:
        nodes = sorted({group.placement[rank]["node_ip"] for rank in unreadable})
        raise AlignError(
            f"rank(s) {', '.join(map(str, unreadable))} on node(s) {', '.join(nodes)} cannot read {folder}: "
            "the output root must be shared storage that every node mounts at the same path"
        )
