"""A sweep on Ray Tune. The stages the swept one reads run once (skipped when up to date); then Tune draws
the variants (grid, random or Optuna) and runs each as a trial: the swept stage and the stages that read it,
under their variant names (`dpo[beta=0.1]`), on ranks in the trial's own placement group, side by side as
the resources hold. ASHA stops variants that lag on a value their trainer logs. Last, the eval stages compare
every variant that finished.

A variant is a set of ordinary stages: its records, its checkpoints and the skip logic are the controller's
(align/run/controller.py). `sweep.json` in the pipeline's folder keeps each variant's values and end, so a
rerun skips what finished (without starting Ray when nothing is left) and resumes what was interrupted.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from align.errors import AlignError, Interrupted, StageFailed
from align.pipeline.file import with_variants
from align.pipeline.graph import upstream
from align.pipeline.sweep import Sweep
from align.planning.hardware import Hardware
from align.planning.plan import Plan, StagePlan, build
from align.run import records, stop
from align.run.controller import Outcome, Schedule
from align.run.launch import ray_launch
from align.run.lock import run_lock
from align.run.ray_stages import RayStages, check_shared, ray_launcher
from align.run.reservation import NOTE_EVERY_S, free_per_node, largest_node, shown
from align.run.services import stage_services
from align.run.workers import GroupShape, WorkerGroup

STATE = "sweep.json"
ENDS = ("succeeded", "stopped", "failed", "interrupted")  # how a variant ended, the most final first
STOP_GRACE_S = 30.0  # after an interrupt, how long the trials get to set their stages aside
Event = Callable[[str], None]


@dataclass(frozen=True)
class Context:
    """What a trial needs to run its variant, sent once to every trial (Tune's `with_parameters`)."""

    sweep: Sweep
    source_dir: str | None
    hardware: Hardware
    embedded: bool
    bundle: tuple[tuple[str, float], ...]
    env: dict[str, str]


def state_path(plan: Plan) -> Path:
    return records.pipeline_dir(plan.pipeline.defaults.output_root, plan.pipeline.name) / STATE


def read_state(path: Path, sweep: Sweep) -> list[dict[str, Any]]:
    """The variants an earlier run of this same sweep drew, with how each ended; none for another sweep (other
    values, method or seed: ranking by another metric, or asking for more samples, keeps them)."""
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return state["variants"] if drawn_alike(state.get("spec") or {}, sweep) else []


def drawn_alike(spec: dict[str, Any], sweep: Sweep) -> bool:
    """Whether a sweep state's spec draws the same variants as `sweep`."""
    same = ("parameters", "method", "seed")
    return {k: spec.get(k) for k in same} == {k: sweep.spec.model_dump(mode="json")[k] for k in same}


def key(values: dict[str, Any]) -> str:
    """A variant's values as one comparable string."""
    return json.dumps(values, sort_keys=True)


def write_state(path: Path, sweep: Sweep, variants: list[dict[str, Any]]) -> None:
    records.write_json(path, {"spec": sweep.spec.model_dump(mode="json"), "variants": variants})


def all_drawn(sweep: Sweep, known: list[dict[str, Any]]) -> bool:
    """Whether the earlier runs drew every variant the sweep asks for and each ended for good."""
    ended = [variant for variant in known if variant["status"] in ("succeeded", "stopped")]
    if sweep.grid is not None:
        return all(any(v["values"] == values for v in ended) for values in sweep.grid)
    return len(ended) >= sweep.spec.samples


def run_sweep(
    plan: Plan,
    *,
    address: str | None,
    verbose: bool,
    on_event: Event,
    on_progress: Callable[[str, dict[str, Any]], None],
    command: str,
) -> list[Outcome]:
    """Run the sweep of `plan` (its pipeline has one): shared stages, then the variants on Tune, then the
    eval stages that compare them; every stage's outcome in the order of the expanded pipeline."""
    sweep: Sweep = plan.pipeline.sweep
    on_event = once_each(on_event)
    folder = records.pipeline_dir(plan.pipeline.defaults.output_root, plan.pipeline.name)
    known = read_state(state_path(plan), sweep)
    started = time.time()
    stop.clear()
    with (
        run_lock(folder, command) as lock,
        ray_launcher(plan, lock, address, verbose, on_event, on_progress) as ray,
    ):
        shared = [name for name in plan.order if name in upstream(plan.edges, {first_variant(plan, sweep)})]
        shared = [name for name in shared if name not in variant_stages(plan, sweep)]
        outcomes = Schedule(plan, shared, set(), set(), on_event).run(ray, ray)
        if not all_drawn(sweep, known):
            known = tune_variants(plan, ray, known, on_event, on_progress)
        finished = [variant["values"] for variant in known if variant["status"] == "succeeded"]
        for variant in known:
            if variant["status"] == "stopped":
                on_event(f"[{sweep.name(sweep.stage, variant['values'])}] {variant['reason']}")
        if not finished:
            why = next((f": {v['error']}" for v in known if v["status"] == "failed"), "")
            raise StageFailed(f"no variant of the sweep finished, nothing to compare{why}")
        final = build(with_variants(sweep, finished, plan.pipeline.source_dir), plan.hardware)
        last = Schedule(final, list(final.order), set(), set(), on_event).run(ray, ray)
        outcomes = [ran_here(outcome, started) for outcome in [*outcomes, *last[len(outcomes) :]]]
    failed = [variant for variant in known if variant["status"] == "failed"]
    if failed:
        names = ", ".join(sweep.name(sweep.stage, variant["values"]) for variant in failed)
        on_event(f"sweep: {len(failed)} variant(s) failed ({names}); the others are compared")
    return outcomes


def once_each(on_event: Event) -> Event:
    """`on_event` without the repeats a sweep's schedules make: each trial, then the last schedule, finds the
    shared stages (and the variants this run made) up to date; said once, or not after they ran."""
    said: set[str] = set()

    def say(line: str) -> None:
        stage, _, rest = line.partition("] ")
        if rest.startswith(("skipped: up to date", "running ")):
            if stage in said:
                return
            said.add(stage)
        on_event(line)

    return say


def ran_here(outcome: Outcome, since: float) -> Outcome:
    """A stage the last schedule skipped as up to date because a trial of this run made it: as it ran."""
    record = records.read_record(outcome.folder) or {}
    if outcome.status != "skipped" or record.get("started", 0) < since:
        return outcome
    return replace(outcome, status="ran", seconds=record["ended"] - record["started"])


def first_variant(plan: Plan, sweep: Sweep) -> str:
    """A stage of the plan that is the swept stage or a variant of it."""
    return next(name for name in plan.order if name == sweep.stage or name.startswith(f"{sweep.stage}["))


def variant_stages(plan: Plan, sweep: Sweep) -> set[str]:
    """The plan's stages a variant runs (before any variant is drawn: the repeated stages as written)."""
    return {
        name
        for name in plan.order
        if name in sweep.repeated or any(name.startswith(f"{stage}[") for stage in sweep.repeated)
    }


def tune_variants(
    plan: Plan,
    ray_stages: RayStages,
    known: list[dict[str, Any]],
    on_event: Event,
    on_progress: Callable[[str, dict[str, Any]], None],
) -> list[dict[str, Any]]:
    """Draw and run the variants on Ray Tune; each variant's values and end, this run's and earlier ones'."""
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")  # logged names arrive as they're logged
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # Tune's own console tables: align prints its own lines
    from ray import tune

    for logger in ("ray.tune", "ray.train", "ray.air"):  # each variant's end is said here, in one line
        logging.getLogger(logger).setLevel(logging.CRITICAL)
    sweep: Sweep = plan.pipeline.sweep
    ray_stages.start(plan.stages[first_variant(plan, sweep)])
    with ray_stages.workers.lock:
        ray_stages.workers.stop_idle()  # the shared stages' warm ranks would hold the cores the trials need
    stage = plan.stages[first_variant(plan, sweep)]
    side_by_side = sweep.spec.max_concurrent or variants_at_once(sweep, stage, ray_stages.embedded)
    shape = GroupShape.of(
        replace(stage, resources=replace(stage.resources, alongside=side_by_side)),
        plan.hardware.accelerator,
        ray_stages.embedded,
    )
    context = Context(
        sweep,
        plan.pipeline.source_dir,
        plan.hardware,
        ray_stages.embedded,
        shape.bundle,
        ray_stages.workers.env,
    )
    resources = tune.PlacementGroupFactory(
        [{}] + [dict(shape.bundle)] * shape.workers, strategy=shape.strategy.upper()
    )
    ended = {key(v["values"]): v for v in known if v["status"] in ("succeeded", "stopped")}
    progress = trial_progress(sweep, on_event, on_progress)
    tuner = tune.Tuner(
        tune.with_resources(tune.with_parameters(run_variant, context=context, ended=ended), resources),
        param_space=search_space(sweep),
        tune_config=tune_settings(sweep, plan, known, side_by_side),
        run_config=tune.RunConfig(
            name="sweep",
            storage_path=str(state_path(plan).parent / ".tune"),
            verbose=0,
            callbacks=[progress],
            stop=progress.stopper,
        ),
    )
    found: dict[str, Any] = {}

    def fit() -> None:
        try:
            found["grid"] = tuner.fit()
        except Exception as err:  # noqa: BLE001 - raised in the driver's thread below
            found["error"] = err

    fitting = threading.Thread(target=fit, name="tune", daemon=True)
    fitting.start()
    asked = f"{shape.workers} x {shown(dict(shape.bundle))} ({shape.strategy})"
    try:
        note_at = NOTE_EVERY_S
        while fitting.is_alive():
            fitting.join(0.5)
            waited = time.monotonic() - progress.idle_since
            if progress.running or waited < note_at:
                note_at = NOTE_EVERY_S if progress.running else note_at
                continue
            if waited >= shape.wait_s:
                progress.stop_all = True
                raise AlignError(
                    f"sweep: no variant could start in {shape.wait_s:g} s: each asks {asked}, and the "
                    f"largest node has {shown(largest_node())}; lower the stage's `resources:` or "
                    "`workers:`, or add nodes"
                )
            free = "; ".join(shown(node) for node in free_per_node()) or "none"
            on_event(f"[sweep] waiting {waited:.0f} s for {asked} per variant; free per node: {free}")
            note_at += NOTE_EVERY_S
    except KeyboardInterrupt as err:
        progress.stop_all = True
        on_event("stopping the sweep's variants: each is set aside for the next run to resume")
        fitting.join(STOP_GRACE_S)
        raise Interrupted(getattr(err, "signum", Interrupted.received), "the sweep stopped") from None
    if "error" in found:
        raise AlignError(f"sweep: Ray Tune stopped: {type(found['error']).__name__}: {found['error']}")
    ends = [ending(sweep, result) for result in found["grid"]] + known
    by_values: dict[str, dict[str, Any]] = {}  # a variant drawn twice ended as its best end says
    for end in ends:
        kept = by_values.get(key(end["values"]))
        if kept is None or ENDS.index(end["status"]) < ENDS.index(kept["status"]):
            by_values[key(end["values"])] = end
    variants = list(by_values.values())
    write_state(state_path(plan), sweep, variants)
    return variants


def variants_at_once(sweep: Sweep, stage: StagePlan, embedded: bool) -> int:
    """How many variants run side by side: on an embedded CPU Ray, as many as give each rank a core of its
    own (fewer, slower ranks gain nothing); elsewhere every variant, and Tune starts each once its
    resources are free."""
    count = len(sweep.grid) if sweep.grid is not None else sweep.spec.samples
    if not embedded or stage.resources.gpus or stage.resources.cpus:
        return count
    return max(1, min(count, (os.cpu_count() or 1) // stage.workers))


def search_space(sweep: Sweep) -> dict[str, Any]:
    """Tune's space for the swept values: a grid's lists as `grid_search`, else each list a `choice` and
    each distribution Tune's of that name."""
    from ray import tune

    if sweep.spec.method == "grid":
        return {path: tune.grid_search(values) for path, values in sweep.spec.parameters.items()}
    drawn = {"uniform": tune.uniform, "loguniform": tune.loguniform, "randint": tune.randint}
    space = {}
    for path, values in sweep.spec.parameters.items():
        if isinstance(values, list):
            space[path] = tune.choice(values)
        else:
            ((name, args),) = values.items()
            space[path] = tune.choice(args) if name == "choice" else drawn[name](*args)
    return space


def tune_settings(sweep: Sweep, plan: Plan, known: list[dict[str, Any]], side_by_side: int) -> Any:
    """Tune's search algorithm (with the earlier runs' variants evaluated first, so none is drawn anew),
    scheduler (ASHA, for `early_stop`) and sample count."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.basic_variant import BasicVariantGenerator

    spec = sweep.spec
    seed = spec.seed if spec.seed is not None else plan.pipeline.defaults.seed
    earlier = [variant["values"] for variant in known] or None
    if spec.method == "optuna":
        from ray.tune.search.optuna import OptunaSearch

        class AtTheEnd(OptunaSearch):
            """Optuna hears a variant's metric at its end, when its stages have recorded it; the results
            before (progress, ASHA's values) do not carry it."""

            def on_trial_result(self, trial_id: str, result: dict) -> None:
                if self.metric in result:
                    super().on_trial_result(trial_id, result)

        search = AtTheEnd(metric=spec.metric, mode=spec.mode, seed=seed, points_to_evaluate=earlier)
    elif spec.method == "random":
        search = BasicVariantGenerator(random_state=seed, points_to_evaluate=earlier)
    else:
        search = BasicVariantGenerator()
    scheduler = None
    if spec.early_stop is not None:
        stop_at = max_steps(plan, sweep)
        scheduler = ASHAScheduler(
            time_attr="step",
            metric=spec.early_stop.metric,
            mode=spec.early_stop.mode,
            grace_period=spec.early_stop.grace_steps,
            reduction_factor=spec.early_stop.reduction_factor,
            max_t=stop_at,
        )
    return tune.TuneConfig(
        search_alg=search,
        scheduler=scheduler,
        num_samples=spec.samples,
        max_concurrent_trials=spec.max_concurrent,
        reuse_actors=False,
    )


def max_steps(plan: Plan, sweep: Sweep) -> int:
    """The swept stage's `max_steps` (ASHA's last rung), or no limit."""
    steps = getattr(plan.stages[first_variant(plan, sweep)].stage, "trl", {}).get("max_steps", -1)
    return steps if isinstance(steps, int) and steps > 0 else 10**9


def ending(sweep: Sweep, result: Any) -> dict[str, Any]:
    """One trial's variant as sweep.json keeps it: values, and whether it finished, was stopped by ASHA (at
    which step, on what value), or failed."""
    values = {path: result.config[path] for path in sweep.spec.parameters}
    metrics = result.metrics or {}
    if result.error is not None or metrics.get("variant_failed"):
        error = metrics.get("variant_failed") or str(result.error).strip().splitlines()[-1]
        return {"values": values, "status": "failed", "error": error}
    if metrics.get("variant_done"):
        return {"values": values, "status": "succeeded"}
    if metrics.get("variant_interrupted") or sweep.spec.early_stop is None:
        return {"values": values, "status": "interrupted"}
    early = sweep.spec.early_stop
    value = metrics.get(early.metric)
    shown = f"{early.metric} {value:.4g}" if isinstance(value, float) else early.metric
    reason = f"stopped early by ASHA at step {metrics.get('step')} ({shown}, {early.mode} is better)"
    return {"values": values, "status": "stopped", "step": metrics.get("step"), "reason": reason}


def trial_progress(sweep: Sweep, on_event: Event, on_progress: Callable[[str, dict[str, Any]], None]) -> Any:
    """Tune's callback on the driver: each trial's lines and progress shown as the run's stages' are; its
    `stop_all`, set on an interrupt, is Tune's `stop` (asked on every result)."""
    from ray.tune import Callback

    class TrialProgress(Callback):
        stop_all = False
        running = 0
        idle_since = time.monotonic()  # when no trial was running last

        def on_trial_start(self, iteration: int, trials: list, trial: Any, **_: Any):
            self.running += 1

        def on_trial_complete(self, iteration: int, trials: list, trial: Any, **_: Any):
            self.running -= 1
            self.idle_since = time.monotonic()

        on_trial_error = on_trial_complete

        def stopper(self, trial_id: str, result: dict[str, Any]) -> bool:
            return self.stop_all

        def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict[str, Any], **_: Any):
            for line in result.get("events", []):
                on_event(line)
            if result.get("progress"):
                on_progress(result["stage"], json.loads(result["progress"]))

        def __reduce__(self) -> tuple:  # Tune pickles its settings; the console stays on the driver
            return Callback, ()

    return TrialProgress()


def run_variant(config: dict[str, Any], context: Context, ended: dict[str, dict[str, Any]]) -> None:
    """A Tune trial: one variant's stages (skipped when up to date), on ranks in the trial's placement group;
    its progress reported to Tune as it trains, so that ASHA can stop it."""
    import ray
    from ray import tune

    os.environ.update(context.env)
    sweep = context.sweep
    values = {path: config[path] for path in sweep.spec.parameters}
    earlier = ended.get(key(values))
    if earlier is not None and earlier["status"] == "stopped":
        tune.report({"step": earlier.get("step") or 0, "variant_stopped": True})
        return
    plan = build(with_variants(sweep, [values], context.source_dir), context.hardware)
    names = sweep.variant_stages(values)
    reporter = Reporter(names[0])
    launch = TrialStages(context, ray.util.get_current_placement_group(), reporter)
    folder = records.pipeline_dir(plan.pipeline.defaults.output_root, plan.pipeline.name)
    try:
        needed = upstream(plan.edges, set(names))  # the shared stages are up to date: skipped
        schedule = Schedule(plan, [n for n in plan.order if n in needed], set(), set(), reporter.event)
        with variant_lock(
            folder, names[0]
        ):  # a random draw may repeat a variant: the second one waits, skips
            schedule.run(launch, None)
    except (Interrupted, StageFailed, AlignError) as err:  # the trial ends here: Tune prints no traceback
        if not reporter.stopped:
            tune.report({"step": reporter.step, "variant_failed": str(err).strip().splitlines()[0]})
        return
    final = {}
    for name in names:
        record = records.read_record(
            records.stage_dir(plan.pipeline.defaults.output_root, plan.pipeline.name, name)
        )
        final.update({f"{name}/{key}": value for key, value in (record or {}).get("metrics", {}).items()})
    tune.report({"step": reporter.step, "variant_done": True, **metrics_by_stage(final, sweep, values)})


@contextmanager
def variant_lock(folder: Path, name: str) -> Iterator[None]:
    """Hold one variant's stages for this trial: two trials of the same values would write one folder."""
    with open(folder / f".{name}.lock", "a") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)


def metrics_by_stage(final: dict[str, float], sweep: Sweep, values: dict[str, Any]) -> dict[str, float]:
    """The variant's recorded metrics under the names the sweep's metric uses (`dpo/eval_loss`)."""
    label = f"[{sweep.label(values)}]"
    return {
        key.replace(label, "", 1): value for key, value in final.items() if isinstance(value, int | float)
    }


class Reporter:
    """A trial's link to Tune: each new step's logged values, and each line its stages say, as a result. Once
    Tune stops the trial (ASHA, or the run's interrupt), the report raises; the stage then stops as on Ctrl-C
    and is kept aside."""

    def __init__(self, first: str) -> None:
        self.step, self.stage, self.stopped = 0, first, False
        self.lock = threading.Lock()

    def send(self, result: dict[str, Any]) -> None:
        from ray import tune

        with self.lock:
            try:
                tune.report({"step": self.step, **result})
            except SystemExit:
                self.stopped = True
                raise KeyboardInterrupt from None

    def event(self, line: str) -> None:
        self.send({"events": [line]})

    def progress(self, stage: str, entry: dict[str, Any]) -> None:
        """Each logged step not reported yet, at its own step and in order (the file is read seconds apart,
        and ASHA reads the value logged at each rung), then the progress line. The last step is reported
        with the variant's end: ASHA stops a trial at its last rung."""
        step, last = entry.get("step"), entry.get("max_steps") or math.inf
        since = self.step if stage == self.stage else -1
        for logged in entry.get("recent") or ():
            if since < logged["step"] < last:
                self.step, self.stage = logged["step"], stage
                self.send({"stage": stage, **logged["values"]})
        if step is not None and since < step < last:
            self.step, self.stage = step, stage
            self.send({"stage": stage, "progress": json.dumps(entry)})


@dataclass
class TrialStages:
    """A trial's launcher: each of its stages on a group whose ranks sit in the trial's placement group."""

    context: Context
    placement_group: Any
    reporter: Reporter

    def __call__(self, plan: Plan, stage: StagePlan, scratch: Path, resume: Path | None) -> dict[str, Any]:
        shape = GroupShape(
            stage.workers, plan.hardware.accelerator, self.context.bundle, process_group=stage.process_group
        )
        group = WorkerGroup(
            shape, self.context.env, stage.name, self.reporter.event, within=self.placement_group
        )
        try:
            check_shared(group, scratch.parent)
            with stage_services(stage, self.context.embedded, self.reporter.event) as services:
                result = ray_launch(
                    group,
                    stage,
                    scratch,
                    resume,
                    on_progress=lambda entry: self.reporter.progress(stage.name, entry),
                    services=services,
                )
        finally:
            group.stop()
        return {**result, "ranks": group.placement, "waited_s": 0.0, "at": time.time()}
