"""A sweep in the run's one schedule. Its variants are ordinary stages (`dpo[beta=0.1]`, and the stages that
read the swept one, repeated under the same values) that the controller runs like any other: one lock, one
launcher, one schedule (align/run/controller.py), with their records, checkpoints and skip logic. The stages
the swept one reads run once; the eval stages run last and compare every variant that finished.

What this module adds is the steer of that schedule (`Variants`): it draws values from Ray Tune
(align/run/tune_search.py) and adds each variant's stages as earlier ones end, as many side by side as the
resources hold; it feeds ASHA each step a variant's swept stage logs (typed, from the progress the driver
already reads) and stops a lagging variant's stage through the schedule. `sweep.json` keeps each variant's
values and end (align/run/sweep_state.py), so a rerun skips what ended for good and resumes the rest.
"""

from __future__ import annotations

import os
import queue
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from align.errors import StageFailed
from align.pipeline.file import with_variants
from align.pipeline.graph import downstream
from align.pipeline.sweep import Sweep
from align.planning.plan import Plan, StagePlan, build
from align.records.progress import OnProgress, Progress
from align.run import records
from align.run.controller import Outcome, Schedule, first_line, run_plan
from align.run.ray_stages import RayStages
from align.run.sweep_state import STATE, VariantEnd, key, read_state, write_state
from align.run.tune_search import Draws, EarlyStopper, Logged, LoggedSteps, Stop, draws

Event = Callable[[str], None]


def run_sweep(
    plan: Plan,
    *,
    address: str | None,
    verbose: bool,
    on_event: Event,
    on_progress: OnProgress,
    on_end: Callable[[str], None] = lambda _: None,
    command: str,
) -> list[Outcome]:
    """Run the sweep of `plan` (its pipeline has one) as one run: shared stages, the variants as Tune draws
    them, then the eval stages that compare them; every stage's outcome in the order of the expanded
    pipeline. `sweep.json` is written as the run ends, however it ends."""
    sweep: Sweep = plan.pipeline.sweep
    path = records.pipeline_dir(plan.pipeline.defaults.output_root, plan.pipeline.name) / STATE
    known = read_state(path, sweep)
    variants = Variants(plan, on_event, known)
    try:
        return run_plan(
            plan,
            address=address,
            verbose=verbose,
            on_event=on_event,
            on_progress=variants.progress(on_progress),
            on_end=on_end,
            command=command,
            steer=variants,
        )
    finally:
        if variants.turned and variants.ends() != known:  # under the run's lock, and only when changed
            write_state(path, sweep, variants.ends())


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


def variants_at_once(sweep: Sweep, stage: StagePlan, embedded: bool) -> int:
    """How many variants run side by side: on an embedded CPU Ray, as many as give each rank a core of its
    own (fewer, slower ranks gain nothing); elsewhere every variant, each once Ray reserves its ranks."""
    count = len(sweep.grid) if sweep.grid is not None else sweep.spec.samples
    if not embedded or stage.resources.gpus or stage.resources.cpus:
        return count
    return max(1, min(count, (os.cpu_count() or 1) // stage.workers))


def max_steps(stage: StagePlan) -> int:
    """The swept stage's `max_steps` (ASHA's last rung), or no limit."""
    steps = stage.trl.get("max_steps", -1)
    return steps if isinstance(steps, int) and steps > 0 else 10**9


@dataclass
class InFlight:
    """A variant added to the schedule: its stages (the swept one first), whether it counts against the
    variants side by side (one an earlier run finished is only checked, and skipped), and its end once
    the sweep has set it aside (stopped or failed)."""

    values: dict[str, Any]
    names: list[str]
    counted: bool
    end: VariantEnd | None = None


class Variants:
    """The schedule's steer for a sweep (controller.Steer): each turn it hears ASHA on the steps logged
    since the last, notes the variants whose stages all ended, adds variants while fewer than the resources
    hold are under way and Tune has more, and once all have ended adds the eval stages that compare them."""

    def __init__(self, plan: Plan, on_event: Event, known: list[VariantEnd]) -> None:
        self.plan, self.sweep, self.on_event = plan, plan.pipeline.sweep, on_event
        self.earlier = known
        self.ended: dict[str, VariantEnd] = {end.key: end for end in known if end.for_good}
        self.order = [end.key for end in known]  # every variant, earlier runs' first
        self.values = {end.key: end.values for end in known}
        self.scores: dict[str, float | None] = {}  # each ended variant's metric, for Optuna
        spec, swept = self.sweep.spec, plan.stages[first_variant(plan, self.sweep)]
        seed = spec.seed if spec.seed is not None else plan.pipeline.defaults.seed
        self.draws: Draws = draws(self.sweep, seed, [end.values for end in known])
        self.stopper = EarlyStopper(spec.early_stop, max_steps(swept)) if spec.early_stop else None
        self.swept, self.logged, self.heard = swept, LoggedSteps(), queue.SimpleQueue()
        self.running: dict[str, InFlight] = {}
        self.started: set[str] = set()  # the variants this run added
        self.stopping: dict[str, Stop] = {}
        self.limit: int | None = None
        self.held: dict[str, Any] | None = None  # drawn before the first could be counted
        self.exhausted = self.compared = self.turned = False

    def first(self, plan: Plan) -> list[str]:
        """The stages to run from the start: those no variant repeats and no eval that compares them."""
        later = variant_stages(plan, self.sweep) | downstream(plan.edges, set(self.sweep.evals))
        return [name for name in plan.order if name not in later]

    def progress(self, on_progress: OnProgress) -> OnProgress:
        """The run's progress, shown as it is, with each step a variant's swept stage logs sent to ASHA."""

        def heard(stage: str, entry: Progress) -> None:
            on_progress(stage, entry)
            if self.stopper is not None and stage.startswith(f"{self.sweep.stage}["):
                for event in self.logged.new(stage, entry):  # in the stage's thread: to the driver's
                    self.heard.put(event)

        return heard

    def turn(self, schedule: Schedule, ray: RayStages | None) -> None:
        self.turned = True
        self.judge(schedule)
        self.note_ends(schedule)
        if schedule.failures or self.compared:  # a shared stage failed: its error ends the run
            return
        self.add(schedule, ray)
        if self.exhausted and not self.running:
            self.compare(schedule)

    def judge(self, schedule: Schedule) -> None:
        """ASHA on each step heard since the last turn; a variant it stops is stopped through the schedule."""
        while True:
            try:
                event: Logged = self.heard.get_nowait()
            except queue.Empty:
                return
            swept = {variant.names[0] for variant in self.running.values()}
            if self.stopper is None or event.stage in self.stopping or event.stage not in swept:
                continue  # heard after its stage ended, or after its stop
            if (stop := self.stopper.judge(event)) is not None:
                self.stopping[event.stage] = stop
                schedule.stop_stage(event.stage)

    def set_aside(self, stage: str, err: BaseException) -> bool:
        """A variant's stage stopped by ASHA or failed: the variant ends so, and the run goes on."""
        variant = next((v for v in self.running.values() if stage in v.names), None)
        if variant is None:
            return False
        if isinstance(err, KeyboardInterrupt):
            if stage not in self.stopping:
                return False  # the run's own stop
            stop = self.stopping[stage]
            variant.end = VariantEnd(
                values=variant.values, status="stopped", step=stop.step, reason=stop.reason
            )
            self.on_event(f"[{stage}] {stop.reason}")
        else:
            variant.end = VariantEnd(values=variant.values, status="failed", error=first_line(err))
            self.on_event(f"[{stage}] failed: {first_line(err)}")
        return True

    def note_ends(self, schedule: Schedule) -> None:
        """The variants none of whose stages is waiting or running: ended as the sweep set them aside, or
        succeeded; one whose stages an upstream failure left unrun ends not at all (a rerun runs it)."""
        waiting = {*schedule.todo, *schedule.running.values()}
        for name, variant in list(self.running.items()):
            if waiting.intersection(variant.names):
                continue
            del self.running[name]
            if self.stopper is not None:
                self.stopper.forget(variant.names[0])
            end = variant.end
            if end is None and all(stage in schedule.outcomes for stage in variant.names):
                end = VariantEnd(values=variant.values, status="succeeded")
            if end is not None:
                self.ended[name] = end
                self.scores[name] = self.score(schedule, variant) if end.status == "succeeded" else None
                self.draws.tell(variant.values, self.scores[name], end.status == "failed")

    def score(self, schedule: Schedule, variant: InFlight) -> float | None:
        """The variant's `<stage>/<metric>`, as its stage recorded it (an eval's metric comes later)."""
        head, _, metric = self.sweep.spec.metric.partition("/")
        stage = self.sweep.name(head, variant.values)
        value = schedule.outcomes[stage].metrics.get(metric) if stage in schedule.outcomes else None
        return value if isinstance(value, int | float) else None

    def add(self, schedule: Schedule, ray: RayStages | None) -> None:
        """Add variants while fewer than `limit` are under way and Tune draws more. One ASHA stopped in an
        earlier run is not run again; one an earlier run finished is added uncounted (it is skipped); a
        value drawn again is the same variant."""
        while not self.exhausted:
            if self.limit is not None and self.under_way() >= self.limit:
                return
            values, self.held = self.held or self.draws.next(), None
            if values is None:
                self.exhausted = True
                return
            name = key(values)
            earlier = self.ended.get(name)
            if name in self.started:  # drawn again: the same variant, told now if it ended, else at its end
                if name not in self.running:
                    self.draws.tell(
                        values, self.scores.get(name), earlier is not None and earlier.status == "failed"
                    )
                continue
            if earlier is not None and earlier.status == "stopped":  # an earlier run's stop stands
                self.on_event(f"[{self.sweep.name(self.sweep.stage, values)}] {earlier.reason}")
                self.draws.tell(values, None, False)
                continue
            if earlier is None and self.under_way() >= self.concurrency(ray):
                self.held = values
                return
            self.start(schedule, values, counted=earlier is None)

    def under_way(self) -> int:
        return sum(variant.counted for variant in self.running.values())

    def concurrency(self, ray: RayStages | None) -> int:
        """How many variants run side by side, known once Ray has started (it starts here, in the main
        thread, when a variant is first to run: a rerun with nothing to run never starts it)."""
        if self.limit is None:
            if ray is not None:
                ray.start(self.swept)
            embedded = ray.embedded if ray is not None else True
            self.limit = self.sweep.spec.max_concurrent or variants_at_once(self.sweep, self.swept, embedded)
        return self.limit

    def start(self, schedule: Schedule, values: dict[str, Any], counted: bool) -> None:
        """Put a variant's stages in the schedule, planned with every variant drawn so far (and, for values
        fixed up front, every one to come: one plan for them all)."""
        name = key(values)
        self.started.add(name)
        if name not in self.values:
            self.order.append(name)
            self.values[name] = values
        names = self.sweep.variant_stages(values)
        self.running[name] = InFlight(values, names, counted)
        self.ended.pop(name, None)
        if not all(stage in self.plan.stages for stage in names):
            self.plan = self.planned([*self.values.values(), *self.draws.upcoming()])
        schedule.extend(self.plan, names)

    def planned(self, variants: list[dict[str, Any]]) -> Plan:
        unique = list({key(values): values for values in variants}.values())
        return build(with_variants(self.sweep, unique, self.plan.pipeline.source_dir), self.plan.hardware)

    def compare(self, schedule: Schedule) -> None:
        """Every variant has ended: the eval stages (and what reads them) compare those that finished."""
        self.compared = True
        ends = self.ends()
        finished = [end.values for end in ends if end.status == "succeeded"]
        if not finished:
            why = next((f": {end.error}" for end in ends if end.status == "failed"), "")
            raise StageFailed(f"no variant of the sweep finished, nothing to compare{why}")
        failed = [self.sweep.name(self.sweep.stage, end.values) for end in ends if end.status == "failed"]
        if failed:
            self.on_event(
                f"sweep: {len(failed)} variant(s) failed ({', '.join(failed)}); the others are compared"
            )
        final = self.planned(finished)
        done = {*schedule.outcomes, *schedule.running.values(), *schedule.not_run, *schedule.todo}
        schedule.extend(final, [name for name in final.order if name not in done])

    def ends(self) -> list[VariantEnd]:
        """Each variant's end, in the order drawn (earlier runs' first): a variant under way is interrupted;
        one an earlier run left unfinished and this run did not reach keeps its earlier end."""
        earlier = {end.key: end for end in self.earlier}
        found = []
        for name in self.order:
            if name in self.running:
                found.append(VariantEnd(values=self.values[name], status="interrupted"))
            elif name in self.ended or name in earlier:
                found.append(self.ended.get(name) or earlier[name])
        return found
