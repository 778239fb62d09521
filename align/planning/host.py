"""What a stage's ranks share on the host they run on: its memory, its cores and its GPUs.

A rank's device is its own (the per-rank memory table); the host's RAM is shared by every rank on it. On a
CPU the device is the host, so all of a rank's bytes land there; with GPUs, what is offloaded does
(ZeRO-Offload's optimizer states, FSDP's `cpu_offload`), and the weights of actors that hold no GPU.
On an embedded Ray every rank of a stage runs on this machine, so the plan refuses what it could never
hold (`Hardware.host`); on a cluster the driver cannot see how ranks fall on nodes, and checks nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from align.errors import Problem
from align.models.memory import USABLE_FRACTION, MemoryEstimate, format_bytes
from align.planning.hardware import Hardware, Host
from align.planning.placement import Placement
from align.planning.resources import Request, local_problems
from align.planning.services import local_problems as local_service_problems


class PlannedStage(Protocol):
    """What these checks read of a planned stage: align/planning/plan.py's `StagePlan`, which calls them."""

    name: str
    workers: int
    backend: str
    placement: Placement
    memory: MemoryEstimate | None
    resources: Request | None


@dataclass(frozen=True)
class HostShare:
    """A stage's bytes in its host's RAM: `ranks` ranks of `per_rank` each, and `actors` (the weights of
    its frozen models held in Ray actors without a GPU)."""

    ranks: int
    per_rank: int
    actors: int = 0

    @property
    def total(self) -> int:
        return self.ranks * self.per_rank + self.actors

    def describe(self, host: Host | None) -> str:
        """`8 ranks x 17.2 GB = 138 GB on one host of 25.3 GB (22.7 GB usable)`; with no host known, the
        total if the ranks shared one."""
        ranks = f"{self.ranks} rank{'s' if self.ranks > 1 else ''} x {format_bytes(self.per_rank)}"
        actors = f" + {format_bytes(self.actors)} of actors' weights" if self.actors else ""
        counted = f"{ranks}{actors} = {format_bytes(self.total)}"
        if host is None:
            return f"{counted} if one host runs them all (each node holds its own ranks' share)"
        usable = format_bytes(usable_memory(host))
        return f"{counted} on one host of {format_bytes(host.memory)} ({usable} usable)"


def usable_memory(host: Host) -> int:
    """The share of the host's RAM the ranks may fill: the system, Ray and the driver take the rest."""
    return int(host.memory * USABLE_FRACTION)


def host_share(stage: PlannedStage, accelerator: bool) -> HostShare | None:
    """What the stage puts in its host's RAM, or None without a memory plan (architecture unknown)."""
    if stage.memory is None:
        return None
    per_rank = stage.memory.host.total + (0 if accelerator else stage.memory.device.total)
    actors = sum(service.weight_bytes for service in stage.placement.services if not service.gpus)
    return HostShare(stage.workers, per_rank, actors)


def host_problems(stage: PlannedStage, hardware: Hardware) -> list[Problem]:
    """Everything the host the ranks run on could never give the stage, one line each; nothing when the
    plan is not for this machine."""
    host = hardware.host
    if host is None or stage.resources is None:
        return []
    problems = [
        *local_problems(stage.name, stage.resources, host),
        *local_service_problems(stage.name, stage.placement.services, stage.resources, host),
    ]
    share = host_share(stage, hardware.accelerator)
    if share is not None and share.total > usable_memory(host):
        where = f"stages.{stage.name}"
        path = f"{where}.workers" if stage.workers > 1 else where
        problems.append(Problem(path, f"{share.describe(host)}: {ways_out(stage, hardware.accelerator)}"))
    return problems


def ways_out(stage: PlannedStage, accelerator: bool) -> str:
    """What would make the stage's host share fit, in words."""
    ways = []
    if stage.workers > 1:
        ways.append("fewer workers (the ranks share this host's memory)")
        if not accelerator and stage.backend != "fsdp":
            ways.append("`backend: fsdp` to shard the model states over the ranks")
    if accelerator:
        ways.append("less offloaded to the host")
    ways.append("a cluster with --address, whose nodes' memory counts instead of this one's")
    return ", or ".join(ways) if len(ways) < 3 else ", ".join(ways[:-1]) + ", or " + ways[-1]
