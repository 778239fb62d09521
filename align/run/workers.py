"""A warm group of Ray actors that run a run's stages: started once, kept across stages of the same size.

Ray Train's `TorchTrainer` starts a controller actor and fresh worker processes for every stage, and each
imports torch, transformers and TRL again: about 11 s per stage on 2 cores before the first step. This
group does what Ray Train's torch backend does (one actor per rank, each rank's environment, the process
group over gloo or NCCL, the node's GPUs shared by its ranks) once per run; a stage is then one call per
rank. Between stages a worker resets what a stage leaves in the process (Accelerate's state singletons,
its environment, cached GPU memory), so a stage runs the same on a warm worker as on a fresh one
(tests/test_pipeline_e2e.py; the parts without Ray in tests/test_workers.py).
"""

from __future__ import annotations

import datetime
import importlib
import os
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from align.compat.accelerate import reset_accelerate_state
from align.planning.resources import Request, shared_cpus
from align.records import RankPlace, WorkerConfig
from align.run import stop
from align.run.reservation import Turns, reserve

WARM_IMPORTS = ("torch", "transformers", "trl", "peft", "align.stages.context", "align.stages.training")
"""What every stage imports, imported while the group starts rather than in the first stage."""
PROCESS_GROUP_TIMEOUT_S = 1800


class StageWorker:
    """One rank: joins the group once, then runs stage after stage (`align.run.worker.train_loop`)."""

    def where(self) -> tuple[str, list[str], str]:
        """This actor's node (IP), the GPUs Ray gave it, and the node's id."""
        import ray

        node = ray.get_runtime_context().get_node_id()
        return ray.util.get_node_ip_address(), [str(gpu) for gpu in ray.get_gpu_ids()], node

    def can_read(self, path: str, expected: str) -> bool:
        """Whether this rank sees the driver's output root: it reads back a probe the driver wrote there."""
        try:
            with open(path) as probe:
                return probe.read() == expected
        except OSError:
            return False

    def free_port(self) -> int:
        with socket.socket() as probe:
            probe.bind(("", 0))
            return probe.getsockname()[1]

    def join(self, env: dict[str, str], backend: str | None, threads: int) -> None:
        """Take this rank's environment (and the driver's module folders, where a reward function of the
        user's own imports from), import what stages need, and join the process group (`backend` None:
        a rank that needs none, which then trains as a plain script does)."""
        os.environ.update(env)
        sys.path[:0] = [folder for folder in env.get("PYTHONPATH", "").split(os.pathsep) if folder]
        for module in WARM_IMPORTS:
            importlib.import_module(module)
        import torch
        import torch.distributed as dist

        torch.set_num_threads(threads)
        if torch.cuda.is_available():
            torch.cuda.set_device(int(env.get("LOCAL_RANK", "0")))
        if backend is None:
            return
        dist.init_process_group(
            backend=backend,
            init_method="env://",
            rank=int(env["RANK"]),
            world_size=int(env["WORLD_SIZE"]),
            timeout=datetime.timedelta(seconds=PROCESS_GROUP_TIMEOUT_S),
        )

    def run(self, config: WorkerConfig) -> None:
        """Run one stage on this rank, then leave the process as the next stage expects to find it."""
        from align.run.worker import train_loop

        environment = dict(os.environ)
        try:
            train_loop(config)
        finally:
            reset_process(environment)


def reset_process(environment: dict[str, str]) -> None:
    """Undo what a stage leaves behind: Accelerate's singletons (which refuse a second stage with other
    settings), environment variables it set (a hub token, TensorBoard's folder), and freed memory."""
    import gc

    import torch

    reset_accelerate_state()
    os.environ.clear()
    os.environ.update(environment)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclass(frozen=True)
class GroupShape:
    """What a stage needs of a group: the same shape can run it on the same warm actors."""

    workers: int
    gpu: bool
    bundle: tuple[tuple[str, float], ...]  # one rank's resources, as Ray's placement group bundle
    strategy: str = "pack"
    wait_s: float = 600.0
    process_group: bool = True  # the ranks join one (the stage's backend says: align/backends)

    @classmethod
    def of(cls, stage: Any, gpu: bool, embedded: bool, resources: Request | None = None) -> GroupShape:
        """A stage's shape, with `resources` as launched (by default its plan's). A CPU rank that names no
        CPUs gets, on an embedded Ray, its share of this machine's cores beside the stages started with it
        (ranks may share a core: Ray takes fractions), one CPU on a cluster."""
        request = resources or stage.resources
        shared = shared_cpus(stage.workers, request.alongside) if embedded else 1.0
        bundle = tuple(sorted(request.bundle(shared).items()))
        return cls(stage.workers, gpu, bundle, request.strategy, request.wait_s, stage.process_group)


def rank_environments(
    places: list[tuple[str, list[str]]], master: tuple[str, int], gpu: bool, process_group: bool = True
) -> list[dict]:
    """Each rank's torchrun-style environment, from where each actor landed: ranks on one node share that
    node's GPUs (so NCCL sees its peers), and each takes the one its local rank names. Without a process
    group there is no distributed environment at all: Accelerate reads one (LOCAL_RANK) as "distributed"
    and wraps the model in DDP, even for a single CPU rank."""
    nodes = list(dict.fromkeys(node for node, _ in places))
    envs = []
    for rank, (node, _) in enumerate(places):
        local = [i for i, (other, _) in enumerate(places) if other == node]
        env = {}
        if process_group:
            env = {
                "MASTER_ADDR": master[0],
                "MASTER_PORT": str(master[1]),
                "RANK": str(rank),
                "WORLD_SIZE": str(len(places)),
                "LOCAL_RANK": str(local.index(rank)),
                "LOCAL_WORLD_SIZE": str(len(local)),
                "NODE_RANK": str(nodes.index(node)),
            }
        if gpu:
            shared = sorted({g for i in local for g in places[i][1]}, key=int)
            env["CUDA_VISIBLE_DEVICES"] = ",".join(shared)
            env["ACCELERATE_TORCH_DEVICE"] = f"cuda:{local.index(rank)}"
            env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        else:
            env["ACCELERATE_TORCH_DEVICE"] = "cpu"
        envs.append(env)
    return envs


def rank_order(places: list[tuple[str, list[str], str]]) -> list[int]:
    """Actor indices in rank order: ranks of one node together (nodes in first-seen order), then by GPU.
    Nodes are told apart by id: nodes on one machine (or behind one NAT) can share an IP."""
    nodes = list(dict.fromkeys(place[2] for place in places))
    return sorted(range(len(places)), key=lambda i: (nodes.index(places[i][2]), places[i][1], i))


def advertised(places: list[tuple[str, list[str], str]]) -> list[tuple[str, list[str], str]]:
    """Each place with its node's address as Ray knows the node (`--node-ip-address`), which the other
    nodes reach it by; an actor's own guess is the machine's default route (wrong for loopback nodes)."""
    import ray

    addresses = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes() if node["Alive"]}
    return [(addresses.get(node, ip), gpus, node) for ip, gpus, node in places]


def answers(refs: list[Any]) -> list[Any]:
    """`ray.get(refs)`, polled so that the run's stop reaches a stage's thread waiting on its actors."""
    import ray

    while ray.wait(refs, num_returns=len(refs), timeout=0.5)[1]:
        stop.check()
    return ray.get(refs)


class WorkerGroup:
    """`shape.workers` actors in one process group, each in its own bundle of a placement group reserved
    all at once (align/run/reservation.py), with `env` (the driver's, align/run/launch.py `worker_env`) and
    its rank's; `run` calls every rank and returns their futures. `placement` says where each rank runs."""

    def __init__(
        self,
        shape: GroupShape,
        env: dict[str, str],
        stage: str,
        say: Callable[[str], None],
        holders: Callable[[], list[str]] = list,
    ) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.shape, self.stopped, self.actors = shape, False, []
        bundle = dict(shape.bundle)
        bundles = [bundle] * shape.workers
        self.placement_group = reserve(stage, bundles, shape.strategy, shape.wait_s, say, holders)
        try:
            custom = {key: value for key, value in bundle.items() if key not in ("CPU", "GPU")}
            remote = ray.remote(max_restarts=0, max_concurrency=1)(StageWorker)
            for index in range(shape.workers):
                strategy = PlacementGroupSchedulingStrategy(
                    self.placement_group, placement_group_bundle_index=index
                )
                options = {"num_cpus": bundle["CPU"], "num_gpus": bundle.get("GPU", 0), "resources": custom}
                self.actors.append(remote.options(scheduling_strategy=strategy, **options).remote())
            places = advertised(answers([actor.where.remote() for actor in self.actors]))
            order = rank_order(places)
            self.actors, places = [self.actors[i] for i in order], [places[i] for i in order]
            master = (places[0][0], answers([self.actors[0].free_port.remote()])[0])
            ranks = rank_environments(
                [(node, gpus) for _, gpus, node in places], master, shape.gpu, shape.process_group
            )
            self.placement = [
                RankPlace(
                    rank=r,
                    node_ip=ip,
                    node_id=node,
                    local_rank=int(env_r.get("LOCAL_RANK", 0)),
                    gpus=gpus,
                    cpus=bundle["CPU"],  # its share where it shared an embedded Ray's cores
                )
                for r, ((ip, gpus, node), env_r) in enumerate(zip(places, ranks, strict=True))
            ]
            backend = ("nccl" if shape.gpu else "gloo") if shape.process_group else None
            threads = max(1, round(bundle["CPU"]))
            self.joined = [
                actor.join.remote({**env, **rank}, backend, threads)
                for actor, rank in zip(self.actors, ranks, strict=True)
            ]
        except BaseException:
            self.stop()
            raise

    def run(self, config: WorkerConfig) -> list[Any]:
        return [actor.run.remote(config) for actor in self.actors]

    def unreadable(self, probe: str, expected: str) -> list[int]:
        """The ranks that cannot read back the probe the driver wrote in the output root."""

        seen = answers([actor.can_read.remote(probe, expected) for actor in self.actors])
        return [rank for rank, ok in enumerate(seen) if not ok]

    def stop(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        if self.stopped:
            return
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        remove_placement_group(self.placement_group)
        self.stopped = True


class WarmWorkers:
    """The run's groups: one per running stage, and idle ones kept for a later stage of their shape. A
    stage that needs another shape stops the idle groups first (their CPUs or GPUs go to it), and reserves
    in its turn (the pipeline's order, `Turns`)."""

    def __init__(self, env: dict[str, str], order: list[str], say: Callable[[str], None] = lambda _: None):
        self.env, self.say = env, say
        self.turns = Turns(order)
        self.busy: dict[str, WorkerGroup] = {}
        self.idle: list[WorkerGroup] = []
        self.lock = threading.Lock()

    def acquire(self, shape: GroupShape, stage: str) -> tuple[WorkerGroup, bool]:
        """A group for `stage`: an idle one of its shape, or a new one (True) once Ray reserved it."""
        with self.turns.turn(stage):
            with self.lock:
                kept = next((group for group in self.idle if group.shape == shape), None)
                if kept is not None:
                    self.idle.remove(kept)
                    self.busy[stage] = kept
                    return kept, False
            group = WorkerGroup(shape, self.env, stage, self.say, self.holders)
            with self.lock:
                self.busy[stage] = group
            return group, True

    def release(self, stage: str) -> None:
        """The stage has ended: its group waits for a next stage of its shape, unless a failure stopped it."""
        with self.lock:
            group = self.busy.pop(stage)
            if not group.stopped:
                self.idle.append(group)

    def holders(self) -> list[str]:
        """The stages whose groups hold resources a waiting stage needs: the idle groups are stopped first,
        since they can only free theirs."""
        with self.lock:
            self.stop_idle()
            return sorted(self.busy)

    def stop_idle(self) -> None:
        for group in self.idle:
            group.stop()
        self.idle.clear()

    def stop(self) -> None:
        """Stop every group, unless Ray went first (an interrupt shuts it down, and its workers with it)."""
        if not (self.busy or self.idle):
            return  # and Ray need not be imported: a run that skipped every stage never started it
        import ray

        if not ray.is_initialized():
            return
        with self.lock:
            for group in [*self.busy.values(), *self.idle]:
                group.stop()
            self.busy.clear()
            self.idle.clear()
