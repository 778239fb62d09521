"""Stages on Ray: the run's default launcher. Each stage runs on warm workers of its shape
(align/run/workers.py), reserved in the pipeline's order; Ray starts with the first stage that runs (a run
that skips every stage never starts it) and stops, with the workers, before the run's lock is released."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from align.errors import AlignError, Interrupted
from align.planning.launch import Launch
from align.planning.plan import Plan
from align.records.progress import OnProgress
from align.run import records
from align.run.launch import Launched, connect, connected, disconnect, ray_launch, worker_env
from align.run.lock import RunLock
from align.run.services import stage_services
from align.run.workers import GroupShape, WarmWorkers

Event = Callable[[str], None]


@dataclass
class RayStages:
    """The default launcher: each stage on warm Ray workers of its shape (align/run/workers.py), Ray
    started by the first stage that runs (a run that skips every stage never starts it)."""

    plan: Plan
    lock: RunLock
    address: str | None
    verbose: bool
    on_event: Event
    on_progress: OnProgress
    workers: WarmWorkers
    embedded: bool = True

    def start(self, stage: Launch) -> None:
        """Connect to Ray (from the main thread, which handles signals) and say which Ray, in one line."""
        if connected():
            return
        plan = self.plan
        messages = records.pipeline_dir(plan.pipeline.defaults.output_root, plan.pipeline.name)
        try:
            self.embedded, which = connect(self.address, self.verbose, messages / "ray-messages.log")
        except Interrupted as err:
            where = f"stopped while Ray started, before stage '{stage.name}' (earlier stages are kept)"
            raise Interrupted(err.signum, where) from None
        self.on_event(which)

    def __call__(self, plan: Plan, stage: Launch, scratch: Path, resume: Path | None) -> Launched:
        """One attempt at `stage`, on a group of its shape; a new group first proves that every rank reads
        the output root. The embedded Ray's processes are noted under the run's lock, so that a later run
        can stop them should this driver be killed."""
        shape = GroupShape.of(stage.plan, plan.hardware.accelerator, self.embedded, stage.resources)
        asked = time.monotonic()
        group, fresh = self.workers.acquire(shape, stage.name)
        waited = time.monotonic() - asked
        try:
            self.lock.note_processes()
            if fresh:
                check_shared(group, scratch.parent)
            with stage_services(stage, self.embedded, self.on_event) as services:
                result = ray_launch(
                    group,
                    stage,
                    scratch,
                    resume,
                    verbose=self.verbose,
                    on_progress=lambda progress: self.on_progress(stage.name, progress),
                    services=services,
                )
        finally:
            self.workers.release(stage.name)
        return Launched(result, group.placement, waited)


@contextmanager
def ray_launcher(
    plan: Plan,
    lock: RunLock,
    address: str | None,
    verbose: bool,
    on_event: Event,
    on_progress: OnProgress,
) -> Iterator[RayStages]:
    """The run's Ray launcher; its workers and the Ray it started stop before the run's lock is released."""
    workers = WarmWorkers(worker_env(plan.pipeline.module_roots()), plan.order, on_event)
    try:
        yield RayStages(plan, lock, address, verbose, on_event, on_progress, workers)
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
