"""What a stage asks Ray for: one bundle per rank, reserved all at once (a placement group), with how long
to wait for it. The plan fixes the request; where the group starts (align/run/workers.py) fills in the one
default that depends on which Ray it joined: the CPUs of a CPU rank, this machine's cores on an embedded
Ray, split among the stages the run starts side by side (`alongside`, counted by the run's Schedule).
`local_problems` says what an embedded Ray could never give one stage; stages side by side split the cores
further, and are not refused for it."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from align.config.spec import Pipeline
from align.errors import Problem
from align.planning.hardware import Host

RANKS_PER_CORE = 4
"""The most CPU ranks an embedded Ray runs per core when they name no CPUs: each is a process with its own
torch threads and model, and past a quarter of a core each they take turns more than they compute."""


@dataclass(frozen=True)
class Request:
    workers: int
    cpus: float | None  # per rank; None: this machine's cores shared on an embedded Ray, 1 on a cluster
    gpus: float
    custom: dict[str, float] = field(default_factory=dict)
    strategy: str = "pack"
    wait_s: float = 600.0
    stage: str = ""  # whose request: names the YAML path of a refusal
    alongside: int = 1  # stages side by side, itself included: they split an embedded Ray's cores

    def bundle(self, cpus: float) -> dict[str, float]:
        """One rank's bundle, with `cpus` for a request that left them to where the group starts."""
        return {"CPU": self.cpus or cpus, **({"GPU": self.gpus} if self.gpus else {}), **self.custom}

    def describe(self) -> str:
        cpus = f"{self.cpus:g}" if self.cpus else "shared"
        custom = {key: f"{value:g}" for key, value in self.custom.items()}
        each = {"CPU": cpus, **({"GPU": f"{self.gpus:g}"} if self.gpus else {}), **custom}
        shown = ", ".join(f"{key}: {value}" for key, value in each.items())
        here = self.on_this_machine()
        return f"{self.workers} x {{{shown}}} ({self.strategy}), waiting at most {self.wait_s:g} s" + (
            f"; {here}" if here else ""
        )

    def on_this_machine(self) -> str:
        """What an embedded Ray on this machine makes of a CPU request that names no CPUs: ranks sharing its
        cores. What it could never hold, the plan refuses (`local_problems`)."""
        if self.gpus or self.custom or self.cpus is not None:
            return ""
        cores = os.cpu_count() or 1
        if beside := self.beside():
            return f"embedded: {beside} (all {cores} when it runs alone; 1 CPU per rank on a cluster)"
        if self.workers == 1:
            return f"embedded: the rank takes this machine's {cores} cores (1 CPU on a cluster)"
        each = f"{shared_cpus(self.workers):g} CPU each, 1 on a cluster"
        return f"embedded: {self.workers} ranks share this machine's {cores} cores ({each})"

    def beside(self) -> str:
        """The part of an embedded Ray's cores this stage takes beside the stages that run with it, in words;
        "" when it runs alone or names its own CPUs, GPUs or resources (those it gets as asked)."""
        if self.alongside == 1 or self.cpus is not None or self.gpus or self.custom:
            return ""
        others = f"{self.alongside - 1} other stage{'s' if self.alongside > 2 else ''}"
        part = f"{shared_cpus(1, self.alongside):g} of this machine's {os.cpu_count() or 1} cores"
        ranks = f", {shared_cpus(self.workers, self.alongside):g} CPU per rank" if self.workers > 1 else ""
        return f"beside {others}: {part}{ranks}"


def shared_cpus(workers: int, alongside: int = 1) -> float:
    """Each CPU rank's share of this machine's cores on an embedded Ray (Ray takes fractions of a CPU): the
    `alongside` stages that run side by side take equal parts, and a stage's `workers` ranks split its part
    (bench/results/concurrency-cpu.md: side by side on one core each beats one after the other on all).
    Rounded down, so that the shares add up to no more than the machine has."""
    return math.floor((os.cpu_count() or 1) / (workers * alongside) * 10_000) / 10_000


def stage_request(pipeline: Pipeline, name: str, workers: int, accelerator: bool) -> Request:
    spec = pipeline.stage_resources(name)
    gpus = spec.gpus_per_worker if spec.gpus_per_worker is not None else (1.0 if accelerator else 0.0)
    cpus = spec.cpus_per_worker if spec.cpus_per_worker is not None else (1.0 if gpus else None)
    return Request(workers, cpus, gpus, dict(spec.custom), spec.strategy, spec.wait_s, name)


def local_problems(name: str, request: Request, host: Host) -> list[Problem]:
    """What an embedded Ray on `host` could never hold (it would wait forever), or would share so thinly
    that its ranks only take turns: one line each."""
    where = f"stages.{name}.resources"
    problems = []
    if request.cpus is None and not request.gpus and request.workers > host.cores * RANKS_PER_CORE:
        problems.append(
            Problem(
                f"stages.{name}.workers",
                f"{request.workers} CPU ranks would share this machine's {host.cores} cores "
                f"({host.cores / request.workers:.2g} of a core each); an embedded Ray gives each rank at "
                f"least 1/{RANKS_PER_CORE} of a core, so at most {host.cores * RANKS_PER_CORE} ranks here: "
                "fewer workers, `resources.cpus_per_worker` to split the cores finer on purpose, or a "
                "cluster with --address",
            )
        )
    if request.cpus and request.cpus * request.workers > host.cores:
        problems.append(
            Problem(
                f"{where}.cpus_per_worker",
                f"{request.workers} ranks x {request.cpus:g} CPUs need {request.cpus * request.workers:g}; "
                f"this machine has {host.cores}: ask for less (ranks may share cores, e.g. "
                f"{host.cores / request.workers:.2g}), or run on a cluster with --address",
            )
        )
    if request.gpus * request.workers > host.gpus:
        problems.append(
            Problem(
                f"{where}.gpus_per_worker",
                f"{request.workers} ranks x {request.gpus:g} GPUs need {request.gpus * request.workers:g}; "
                f"this machine has {host.gpus}: fewer workers, `gpus_per_worker: 0` to run on the CPU, a "
                "cluster with --address, or `align plan --device-memory` to plan for GPUs elsewhere",
            )
        )
    if request.custom:
        problems.append(
            Problem(
                f"{where}.custom",
                f"{', '.join(request.custom)}: an embedded Ray has no custom resources; run on a cluster "
                "whose nodes declare them, with --address",
            )
        )
    return problems
