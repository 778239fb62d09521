"""The Ray driver: a thin controller that walks the plan and runs each stage on warm Ray workers.

It reads like single-process code: hold the pipeline's output folder, then start each stage whose inputs
are ready (stages the DAG leaves independent run side by side, as far as the cluster holds them): skip it
if its record matches, else launch it (resuming an earlier attempt's checkpoint, retrying lost workers)
and publish its folder when it ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, as_completed, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from align.config.secrets import redact
from align.errors import AlignError, Interrupted, StageFailed
from align.pipeline.graph import downstream, upstream
from align.planning.launch import Launch, beside, launch_of, priced
from align.planning.plan import ModelInput, Plan
from align.records import Attempt, MemoryRow, Resolved, StageRecord
from align.records.progress import OnProgress
from align.run import records, stop
from align.run.disk import check_space, probe_writable
from align.run.inputs import fingerprint, output_of, pinned, resolve_inputs
from align.run.launch import Launched, LostWorkers
from align.run.lock import run_lock
from align.run.ray_stages import RayStages, ray_launcher
from align.stages.checkpoints import latest_complete, remove_torn

Event = Callable[[str], None]

Launcher = Callable[[Plan, Launch, Path, Path | None], Launched]
"""Runs one attempt at a stage (its plan, and its resolved inputs beside it) into a scratch folder, from a
checkpoint folder when one is given; returns rank 0's result and where the ranks ran. Raises LostWorkers
when a retry may help."""


@dataclass(frozen=True)
class Outcome:
    """How one stage ended in this run: ran, or skipped because its record matched."""

    stage: str
    status: str  # "ran" | "skipped"
    folder: Path
    seconds: float
    metrics: dict[str, float]


class Steer(Protocol):
    """What a sweep does in the run's one schedule (align/run/sweep.py): it names the stages to run from the
    start; each turn of the schedule's loop it may add stages (`Schedule.extend`) or stop one
    (`Schedule.stop_stage`); a stage's failure or stop that it takes as its own (a variant's) is no failure
    of the run."""

    def first(self, plan: Plan) -> list[str]: ...

    def turn(self, schedule: Schedule, ray: RayStages | None) -> None: ...

    def set_aside(self, stage: str, err: BaseException) -> bool: ...


def memory_plan(stage: Launch) -> list[MemoryRow] | None:
    """The plan's per-rank bytes under the stage's backend, row by row as `align plan` shows them, so that
    `align report` can set them beside the peaks each rank measured; None without an architecture."""
    if stage.memory is None:
        return None
    return [MemoryRow(what=label, device=device, host=host) for label, device, host in stage.memory.rows()]


def started_record(plan: Plan, launch: Launch, stamp: str) -> StageRecord:
    """The record a stage's attempt holds from its start: what produces it, as the plan resolved it."""
    stage, inputs = launch.plan, launch.inputs.model
    resolved = Resolved(
        backend=stage.backend,
        backend_reason=stage.backend_reason,
        workers=stage.workers,
        precision=stage.precision,
        trainable_dtype=stage.trainable_dtype,
        seed=stage.seed,
        model=inputs.base,
        adapters=list(inputs.adapters),
    )
    return StageRecord(
        pipeline=plan.pipeline.name,
        stage=stage.name,
        kind=stage.kind,
        fingerprint=stamp,
        config=redact(launch.stage.model_dump(mode="json")),
        resolved=resolved,
        memory_plan=memory_plan(launch),
        versions=records.versions(),
        git_sha=records.git_sha(),
        started=time.time(),
    )


def run_stage(
    plan: Plan,
    stage: Launch,
    stamp: str,
    folder: Path,
    launch: Launcher,
    *,
    restart: bool,
    on_event: Event,
) -> StageRecord:
    """Run one stage into a scratch folder and publish it with its record; keep it aside on failure.

    An earlier attempt with the same fingerprint (a killed or interrupted run) is continued from its
    latest complete checkpoint, unless `restart`; a lost worker is retried up to `max_failures`."""
    record = started_record(plan, stage, stamp)
    earlier = None if restart else records.resumable(folder, stamp)
    scratch = records.start_attempt(folder, record, earlier[0] if earlier else None)
    attempts: list[Attempt] = []
    try:
        launched = attempt_until_done(plan, stage, scratch, launch, attempts, on_event)
    except (AlignError, StageFailed, KeyboardInterrupt, OSError) as err:
        status = "interrupted" if isinstance(err, KeyboardInterrupt) else "failed"
        ended = record.ended_as(status, ended=time.time(), error=str(err), attempts=attempts)
        raise with_kept_folder(err, stage.name, records.keep_failed(scratch, folder, ended)) from None
    for leftover in (path for path in scratch.iterdir() if path.is_dir() and not any(path.iterdir())):
        leftover.rmdir()  # e.g. checkpoints/ when the stage saved none
    record = succeeded(record, launched, stage.inputs.model, folder, attempts)
    records.publish(scratch, folder, record)
    records.clear_attempts(folder)
    return record


def succeeded(
    record: StageRecord, launched: Launched, inputs: ModelInput, folder: Path, attempts: list[Attempt]
) -> StageRecord:
    """The record of a stage that ended well: its result, where its ranks ran, how many attempts it took."""
    result, resumed_from = launched.result, attempts[-1].resumed_from
    return record.ended_as(
        "succeeded",
        ended=time.time(),
        metrics=result.metrics,
        samples=result.samples,
        ranks=launched.ranks,  # where each rank ran: node, GPUs, CPUs, local rank
        output=output_of(result, inputs, folder),
        resumed_from=resumed_from,
        steps_trained=None if result.steps is None else result.steps - (resumed_from or 0),
        waited_s=launched.waited_s,  # for its workers' resources, held by other stages
        retries=len(attempts) - 1,
        attempts=attempts,
    )


def attempt_until_done(
    plan: Plan,
    stage: Launch,
    scratch: Path,
    launch: Launcher,
    attempts: list[Attempt],
    on_event: Event,
) -> Launched:
    """Launch the stage, each time from its latest complete checkpoint, until it ends or has lost workers
    more than `max_failures` times. Each attempt is noted in `attempts` (where it started, how it ended)."""
    while True:
        torn = remove_torn(scratch)
        checkpoint = latest_complete(scratch)
        attempts.append(Attempt(started=time.time(), resumed_from=checkpoint[0] if checkpoint else None))
        if torn:
            on_event(f"[{stage.name}] set aside unfinished checkpoint(s) at step {', '.join(map(str, torn))}")
        if checkpoint:
            on_event(f"[{stage.name}] resuming from step {checkpoint[0]} ({checkpoint[1]})")
        try:
            return launch(plan, stage, scratch, checkpoint[1] if checkpoint else None)
        except LostWorkers as err:
            attempts[-1] = attempts[-1].model_copy(update={"error": str(err)})
            retries, most = len(attempts) - 1, stage.plan.max_failures
            if retries >= most:
                raise StageFailed(f"{err}; gave up after {retries} retries (max_failures: {most})") from None
            on_event(f"[{stage.name}] {err}; retry {retries + 1} of {most}, from the last checkpoint")


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


def first_line(err: BaseException) -> str:
    return str(err).splitlines()[0] if str(err) else type(err).__name__


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
    on_progress: OnProgress = lambda *_: None,
    on_end: Callable[[str], None] = lambda _: None,
    launch: Launcher | None = None,
    command: str = "align run",
    steer: Steer | None = None,
) -> list[Outcome]:
    """Run (or skip) each selected stage once its inputs are ready, side by side where the DAG and the
    cluster allow; a changed stage reruns its dependents. A failed stage stops its dependents while the
    others finish; its error is raised at the end. Ctrl-C/SIGTERM stops every running stage and keeps each.

    The pipeline's output folder is held for the whole run (a second run is refused) and checked
    writable first. `launch` runs a stage; by default on the run's warm Ray workers (`ray_launch`). `steer`
    adds and stops stages as the run goes (a sweep's variants). `on_end(stage)`: a stage ended, however."""
    wanted, forced = selected_stages(plan, list(only), [*force, *restart])
    root = plan.pipeline.defaults.output_root
    pipeline_folder = records.pipeline_dir(root, plan.pipeline.name)
    probe_writable(pipeline_folder)
    stop.clear()
    with (
        run_lock(pipeline_folder, command) as lock,
        ray_launcher(plan, lock, address, verbose, on_event, on_progress) as ray,
    ):
        if lock.stopped:
            on_event(f"stopped {len(lock.stopped)} process(es) left running by a run that was killed")
        todo = steer.first(plan) if steer is not None else [n for n in plan.order if n in wanted]
        schedule = Schedule(plan, todo, forced, set(restart), on_event, on_end, steer=steer)
        return schedule.run(launch or ray, ray if launch is None else None)


def up_to_date(record: StageRecord | None, stamp: str) -> bool:
    return record is not None and record.succeeded and record.fingerprint == stamp


@dataclass
class Schedule:
    """The stages of one run, started as their inputs are ready (each in its own thread, which waits on
    its ranks) and collected as they end. Signals land in the driver's main thread, which waits here."""

    plan: Plan
    todo: list[str]  # in the pipeline's order
    forced: set[str]
    restart: set[str]
    on_event: Event
    on_end: Callable[[str], None] = lambda _: None
    steer: Steer | None = None
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    failures: dict[str, BaseException] = field(default_factory=dict)
    running: dict[Future, str] = field(default_factory=dict)
    not_run: set[str] = field(default_factory=set)  # an upstream stage failed
    folders: dict[str, Path] = field(init=False)

    def __post_init__(self) -> None:
        root, name = self.plan.pipeline.defaults.output_root, self.plan.pipeline.name
        self.folders = {stage: records.stage_dir(root, name, stage) for stage in self.plan.order}

    def run(self, launch: Launcher, ray: RayStages | None) -> list[Outcome]:
        threads = 64 if self.steer else max(1, len(self.todo))  # a steer adds stages as it goes
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="stage") as pool:
            try:
                while True:
                    if self.steer is not None:
                        self.steer.turn(self, ray)
                    if not (self.todo or self.running):
                        break
                    self.start_ready(pool, launch, ray)
                    finished, _ = wait(list(self.running), timeout=0.5, return_when=FIRST_COMPLETED)
                    self.collect(finished)
            except KeyboardInterrupt as err:
                raise self.stopped(err) from None
        if self.failures:
            raise next(self.failures[name] for name in self.plan.order if name in self.failures)
        return [self.outcomes[name] for name in self.plan.order if name in self.outcomes]

    def extend(self, plan: Plan, names: list[str]) -> None:
        """Run `names` too, stages of `plan`: this schedule's plan with more stages (a sweep's variants)."""
        self.plan = plan
        root, pipeline = plan.pipeline.defaults.output_root, plan.pipeline.name
        self.folders = {stage: records.stage_dir(root, pipeline, stage) for stage in plan.order}
        self.todo += [name for name in plan.order if name in names and name not in self.todo]

    def stop_stage(self, name: str) -> None:
        """Stop one running stage (a variant ASHA stops): it is set aside as on Ctrl-C; the others go on."""
        stop.request_stage(name)

    def start_ready(self, pool: ThreadPoolExecutor, launch: Launcher, ray: RayStages | None) -> None:
        """Skip or start, in the pipeline's order, each stage whose upstream stages all succeeded; drop the
        ones an upstream failure leaves without input. The stages started here and those still running run
        side by side: each is told how many (`Request.alongside`), to take its part of an embedded Ray's
        cores rather than all of them and wait its turn."""
        starting = self.ready()
        alongside = len(starting) + len(self.running)
        for stage, stamp in starting:
            stage = beside(stage, alongside)
            share = stage.resources.beside() if stage.resources is not None else ""
            if ray is not None:
                ray.start(stage)  # its one line (which Ray) before the first stage's, in the main thread
                ray.workers.turns.queue(stage.name)
            where = f"{stage.plan.workers} worker(s), backend {stage.plan.backend}"
            if share and ray is not None and ray.embedded:  # a cluster's CPU ranks take one CPU each
                where += f", {share}"
            self.on_event(f"[{stage.name}] running {stage.plan.kind} on {where}")
            self.running[pool.submit(self.run_one, stage, stamp, launch)] = stage.name

    def ready(self) -> list[tuple[Launch, str]]:
        """The stages to start now, with their fingerprints; those up to date are skipped on the way (so that
        their dependents, later in the order, may be ready too)."""
        starting = []
        for name in list(self.todo):
            needs = self.plan.stages[name].upstream
            if failed := [up for up in needs if up in self.failures or up in self.not_run]:
                self.todo.remove(name)
                self.not_run.add(name)
                self.on_event(f"[{name}] not run: it reads '{failed[0]}', which did not finish")
                continue
            if any(up not in self.outcomes for up in needs):
                continue
            self.todo.remove(name)
            folders = self.folders
            planned = self.plan.stages[name]
            stage = pinned(launch_of(planned, resolve_inputs(planned, folders)))  # hub data at a commit
            stamp = fingerprint(stage, folders)
            existing = records.read_stage(folders[name])
            if name not in self.forced and up_to_date(existing, stamp):
                self.on_event(f"[{name}] skipped: up to date ({folders[name] / records.RECORD})")
                self.outcomes[name] = Outcome(name, "skipped", folders[name], 0.0, existing.metrics)
                continue  # its dependents come later in the order, and may be ready now
            stage = priced(self.plan.pipeline, stage)
            check_space(stage, folders[name].parent)
            starting.append((stage, stamp))
        return starting

    def run_one(self, stage: Launch, stamp: str, launch: Launcher) -> Outcome:
        folder = self.folders[stage.name]
        restart = stage.name in self.restart
        with stop.stage(stage.name):  # a stop of this stage alone reaches its thread
            record = run_stage(
                self.plan, stage, stamp, folder, launch, restart=restart, on_event=self.on_event
            )
        seconds, waited = record.ended - record.started, record.waited_s  # 5 s: more than reserving
        queued = f" ({waited:.0f}s of it waiting for resources)" if waited >= 5 else ""
        self.on_event(f"[{stage.name}] done in {seconds:.1f}s{queued} -> {folder}")
        return Outcome(stage.name, "ran", folder, seconds, record.metrics)

    def collect(self, finished: set[Future]) -> None:
        for future in finished:
            name = self.running.pop(future)
            self.on_end(name)
            try:
                self.outcomes[name] = future.result()
            except (Exception, Interrupted) as err:  # noqa: BLE001 - the stage's own end; the others go on
                if self.steer is not None and self.steer.set_aside(name, err):
                    self.not_run.add(name)  # a variant's end: the steer said it; its dependents do not run
                    continue
                if isinstance(err, Interrupted):  # not asked of this stage alone: the run stops
                    raise err
                self.failures[name] = err
                if self.running or self.todo:  # the error itself is raised once the others end
                    self.on_event(f"[{name}] failed: {first_line(err)}")

    def stopped(self, err: KeyboardInterrupt) -> Interrupted:
        """Ask every running stage to stop, wait while each sets itself aside, and say where each was kept."""
        stop.request(getattr(err, "signum", Interrupted.received))
        if self.running:
            names = ", ".join(sorted(self.running.values()))
            self.on_event(f"stopping {names}: each is set aside for the next run to resume")
        kept = [str(err)] if str(err) else []
        for future in as_completed(list(self.running)):
            try:
                future.result()
            except BaseException as stage_err:  # noqa: BLE001 - each one's end is reported together
                if str(stage_err) and str(stage_err) not in kept:
                    kept.append(str(stage_err))
        self.running.clear()
        return Interrupted(Interrupted.received, "\n".join(kept))  # a line per stage
