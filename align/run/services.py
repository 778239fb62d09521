"""Frozen models in Ray actors of their own (`placement: actor`): started for a stage before its ranks run,
each with its own resources, ready (its model loaded) before they start, and killed when the stage's
attempt ends, also on an error or an interrupt.

An actor holds what align/stages/services.py builds for its role. The ranks reach it through a client, a
plain picklable object sent in the stage's config, whose methods wait on Ray here: stage code calls a
method and never imports Ray. Neither the actor nor the client spells those methods: they carry any call
that align/planning/services.py declares (`CALLS`), by name.

An actor that dies mid-stage (killed, out of memory) fails the ranks that call it. The attempt then ends
as a lost worker does, naming the service, and the controller retries the stage from its latest complete
checkpoint with fresh actors, up to `max_failures`; a stage that fails while its actors live is not retried.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

from align.errors import AlignError, StageFailed
from align.planning.launch import Launch
from align.planning.plan import StagePlan
from align.planning.services import SERVICE_CALLS, Service, call_names
from align.run import stop
from align.run.launch import LostWorkers, first_line, worker_env
from align.run.reservation import largest_node, shown

PING_S = 10.0
"""How long a service may take to answer whether it lives, once its stage failed: a live actor ends the
call it is in first; one still busy then is taken as alive (its stage's error stands, not retried)."""


class ServiceActor:
    """One frozen model, answering the calls its role declares (run as a Ray actor, one call at a time)."""

    def __init__(self, launch: Launch, service: Service, env: dict[str, str], threads: int) -> None:
        os.environ.update(env)
        sys.path[:0] = [folder for folder in env.get("PYTHONPATH", "").split(os.pathsep) if folder]
        import torch

        from align.stages.services import start_service

        torch.set_num_threads(threads)
        on_gpu = service.gpus > 0 and torch.cuda.is_available()
        self.held = start_service(launch, service, torch.device("cuda" if on_gpu else "cpu"))
        self.calls = call_names(service.kind)

    def ready(self) -> bool:
        return True

    def call(self, method: str, *args: Any) -> Any:
        """`method` of the held model, one of its role's calls."""
        if method not in self.calls:
            raise AlignError(f"a {type(self.held).__name__} answers {sorted(self.calls)}, not {method}")
        return getattr(self.held, method)(*args)


@dataclass(frozen=True)
class ServiceClient:
    """What a rank holds for one service: each call its role declares (`client.score(...)`,
    `client.log_probs(...)`) is one round trip to the actor."""

    role: str
    handle: Any

    def call(self, method: str, *args: Any) -> Any:
        import ray

        return ray.get(self.handle.call.remote(method, *args))

    def __getattr__(self, name: str) -> Any:
        if name in SERVICE_CALLS:  # reads no field: safe while pickle rebuilds the client
            return partial(self.call, name)
        raise AttributeError(name)

    def lost(self) -> BaseException | None:
        """Ray's error if the actor is gone (ActorDiedError), None if it answers or is still busy."""
        import ray

        try:
            ray.get(self.handle.ready.remote(), timeout=PING_S)
            return None
        except ray.exceptions.RayActorError as err:
            return err
        except ray.exceptions.GetTimeoutError:
            return None


def asked(service: Service, embedded: bool) -> dict[str, float]:
    """The actor's Ray resources: on an embedded Ray no CPU by default (the ranks hold every core)."""
    return {"CPU": service.num_cpus(embedded), "GPU": service.gpus}


def described(resources: dict[str, float]) -> str:
    """`{CPU: 0}`, `{CPU: 1, GPU: 2}`: the CPUs always, even none."""
    gpus = f", GPU: {resources['GPU']:g}" if resources["GPU"] else ""
    return f"{{CPU: {resources['CPU']:g}{gpus}}}"


@contextmanager
def stage_services(
    launch: Launch, embedded: bool, say: Callable[[str], None]
) -> Iterator[dict[str, ServiceClient]]:
    """A client per service the plan places for the stage, by role, once every actor has loaded its model;
    the actors are killed on the way out, however the stage ended. A failed stage whose service died is
    raised as a lost service: retried, as a lost rank is."""
    stage = launch.plan
    services = stage.placement.services
    if not services:
        yield {}
        return
    import ray

    remote = ray.remote(max_restarts=0)(ServiceActor)
    env = worker_env([])
    handles = {}
    try:
        for service in services:
            resources = asked(service, embedded)
            threads = max(1, int(resources["CPU"]))
            options = {"num_cpus": resources["CPU"], "num_gpus": resources["GPU"]}
            handles[service.role] = remote.options(**options).remote(launch, service, env, threads)
        wait_ready(stage, handles, embedded, say)
        clients = {role: ServiceClient(role, handle) for role, handle in handles.items()}
        try:
            yield clients
        except StageFailed as failed:
            dead = {role: why for role, client in clients.items() if (why := client.lost()) is not None}
            raise with_lost_services(stage.name, failed, dead) from None
    finally:
        for handle in handles.values():
            ray.kill(handle, no_restart=True)


def with_lost_services(stage: str, failed: StageFailed, dead: dict[str, BaseException]) -> StageFailed:
    """How a failed attempt ended, given the services found dead (by role, with Ray's error): a rank's error
    from calling a dead actor (ActorDiedError) is the lost service's, not the stage's own."""
    if not dead:
        return failed
    lost = ", ".join(f"{role} service ({type(why).__name__})" for role, why in sorted(dead.items()))
    lost = f"stage '{stage}' lost its {lost}"
    return LostWorkers(f"{lost}; {failed}" if isinstance(failed, LostWorkers) else lost)


def wait_ready(stage: StagePlan, handles: dict[str, Any], embedded: bool, say: Callable[[str], None]) -> None:
    """Wait for each actor to start and load its model, at most its `wait_s`: Ray leaves an actor that no
    node can hold pending forever, with no word (ray#27287), so the wait ends in one line naming it."""
    import ray

    by_role = {service.role: service for service in stage.placement.services}
    pending = {handles[role].ready.remote(): role for role in handles}
    started = time.monotonic()
    while pending:
        stop.check()
        done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=1.0)
        for ref in done:
            role = pending.pop(ref)
            try:
                ray.get(ref)
            except ray.exceptions.RayError as err:
                cause = getattr(err, "cause", None) or err
                raise AlignError(
                    f"stage '{stage.name}': the {role} service failed to start: {first_line(cause)}"
                ) from None
            resources = described(asked(by_role[role], embedded))
            say(f"[{stage.name}] {role}: in a Ray actor of its own, {resources}")
        late = [role for role in pending.values() if time.monotonic() - started > by_role[role].wait_s]
        if late:
            service = by_role[late[0]]
            raise AlignError(
                f"stage '{stage.name}': Ray could not start the {service.role} service "
                f"({described(asked(service, embedded))}) in {service.wait_s:g} s; the largest node has "
                f"{shown(largest_node())}: lower `stages.{stage.name}.{service.role}.resources` or add "
                "nodes; check `ray status`"
            )
