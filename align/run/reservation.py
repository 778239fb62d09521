"""A stage's resources reserved all at once: one bundle per rank in a Ray placement group, or nothing.

Ray leaves a request no node can hold pending forever, with no word (ray#27287): here the wait says every
15 s what is asked and what each node has free, and gives up after the stage's `wait_s` in one line that
names the request and the largest node; while stages of the same run hold what it waits for, it waits for
them without a limit. Stages reserve in the pipeline's order (`Turns`): a big stage is not starved by
smaller ones queued after it. Nothing is held after a failure or an interrupt.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from align.compat.ray import available_resources_per_node, total_resources_per_node
from align.errors import AlignError
from align.run import stop

NOTE_EVERY_S = 15.0


def shown(resources: dict[str, float]) -> str:
    return "{" + ", ".join(f"{key}: {value:g}" for key, value in sorted(resources.items()) if value) + "}"


def schedulable(node: dict[str, float]) -> dict[str, float]:
    """A node's resources a bundle can ask for: CPUs, GPUs, custom ones (not memory, Ray's own labels, or
    the placement groups' own `CPU_group_...`, `bundle_group_...`)."""
    return {
        key: value
        for key, value in node.items()
        if not key.startswith(("node:", "memory", "object_store")) and "_group_" not in key
    }


def free_per_node() -> list[dict[str, float]]:
    """What each live node has free now, largest CPU count first."""
    nodes = available_resources_per_node().values()
    return sorted(map(schedulable, nodes), key=lambda node: -node.get("CPU", 0))


def largest_node() -> dict[str, float]:
    """The biggest node's total resources (by CPUs), the most any one bundle could ever get."""
    totals = total_resources_per_node().values()
    return max(map(schedulable, totals), key=lambda node: node.get("CPU", 0), default={})


class Turns:
    """Reservations in the pipeline's order: a stage reserves once every stage queued before it in that
    order has, so that small stages started later cannot keep a big one waiting."""

    def __init__(self, order: list[str]) -> None:
        self.rank = {name: index for index, name in enumerate(order)}
        self.queued: set[str] = set()
        self.changed = threading.Condition()

    def queue(self, stage: str) -> None:
        """Note a stage about to ask (the driver, starting the stage's thread, in the pipeline's order)."""
        with self.changed:
            self.queued.add(stage)

    @contextmanager
    def turn(self, stage: str) -> Iterator[None]:
        with self.changed:
            self.queued.add(stage)  # a retry queues again
            while min(self.queued, key=lambda name: self.rank.get(name, -1)) != stage:
                self.changed.wait(timeout=1.0)
                stop.check()
        try:
            yield
        finally:
            with self.changed:
                self.queued.discard(stage)
                self.changed.notify_all()


def reserve(
    stage: str,
    bundles: list[dict[str, float]],
    strategy: str,
    wait_s: float,
    say: Callable[[str], None],
    holders: Callable[[], list[str]] = list,
) -> Any:
    """The placement group of `bundles`, once Ray has reserved all of them; AlignError after `wait_s`, a
    limit that counts only while `holders()` (the run's other stages holding resources) is empty."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    group = placement_group(bundles, strategy=strategy.upper())
    asked = f"{len(bundles)} x {shown(bundles[0])} ({strategy})"
    started = time.monotonic()
    note_at = NOTE_EVERY_S
    told: list[str] = []
    try:
        while not ray.wait([group.ready()], timeout=1.0)[0]:
            stop.check()
            if held := holders():
                if not told:  # once: the stages holding it change as they end
                    names = ", ".join(held)
                    say(
                        f"[{stage}] waiting for stage(s) {names} of this run: they hold what it asks "
                        f"({asked})"
                    )
                    told = held
                started, note_at = time.monotonic(), NOTE_EVERY_S
                continue
            waited = time.monotonic() - started
            if waited >= wait_s:
                raise AlignError(
                    f"stage '{stage}': Ray could not reserve {asked} in {wait_s:g} s; the largest node has "
                    f"{shown(largest_node())}: lower `resources:` or `workers:`, or add nodes; "
                    "check `ray status`"
                )
            if waited >= note_at:
                free = "; ".join(shown(node) for node in free_per_node()) or "none"
                say(f"[{stage}] waiting {waited:.0f} s for {asked}; free per node: {free}")
                note_at += NOTE_EVERY_S
    except BaseException:
        remove_placement_group(group)
        raise
    return group
