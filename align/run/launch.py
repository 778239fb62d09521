"""One attempt at a stage on a warm worker group: run it on every rank, wait, classify the end.

The driver waits here (in the stage's thread: stages run side by side), shows progress, and on
Ctrl-C/SIGTERM stops the group's workers.
A failure is either a lost worker (Ray's own error: a killed or OOM-killed process, a lost node), which
the controller retries from the latest checkpoint on a fresh group, or the stage's own error, which is
not retried and is reported once, with the path of the worker log.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from align.compat.ray import embedded_head_settings, no_sigterm_handler, print_driver_lines_with
from align.errors import AlignError, Interrupted, StageFailed
from align.planning.launch import Launch
from align.records import LOGS, Progress, RankPlace, StageResult, WorkerConfig, read_error, read_progress
from align.records.result import clear, take_result
from align.run import stop

if TYPE_CHECKING:
    from align.run.workers import WorkerGroup

FORWARDED_ENV = (
    "HF_HUB_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_HOME",
    "ALIGN_CACHE",
    "TORCH_EXTENSIONS_DIR",
    "PYTHONHASHSEED",
)
EMBEDDED_SYSTEM_CONFIG = {"worker_niceness": 0}
"""Ray starts its workers at niceness 15, below everything else on the machine: a rank's torch threads then
yield to any other process, and one that waits in an OpenMP barrier stalls its step. Ranks are the work
here; they run at the priority of a plain training script (docs/performance.md)."""
POLL_SECONDS = 0.5
FAILURE_GRACE_S = 5.0


class LostWorkers(StageFailed):
    """Ray lost a worker (killed, out of memory, node gone): worth retrying from the latest checkpoint."""


@dataclass(frozen=True)
class Launched:
    """One attempt that ended well: rank 0's result, where each rank ran, and how long the stage waited
    for its workers' resources (held by other stages)."""

    result: StageResult
    ranks: list[RankPlace] = field(default_factory=list)
    waited_s: float = 0.0


def worker_env(module_roots: list[str]) -> dict[str, str]:
    """Environment the workers need from the driver (offline switches, caches), and nothing secret.

    A reward function of the user's own (`allow_custom_code`) imports from `module_roots`: where
    `align` was run and the pipeline file's folder."""
    env = {name: os.environ[name] for name in FORWARDED_ENV if name in os.environ}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*module_roots, os.environ.get("PYTHONPATH")]))
    return {**env, "TOKENIZERS_PARALLELISM": "false"}


def connect(address: str | None, verbose: bool = False, messages: Path | None = None) -> tuple[bool, str]:
    """Join a Ray and say which, in one line; (whether it is an embedded one this run started, the line).

    `address`, else `RAY_ADDRESS`, else a head already running on this machine (the pointer `ray start`
    leaves in Ray's temp folder, as `ray.init()` finds it), else an embedded Ray: no dashboard, loopback
    only. A pointer whose head no longer answers (a killed head), or a head that refuses this driver (token
    auth), is named and an embedded Ray starts instead. Workers' output goes to their log files; `verbose`
    streams it too; Ray's own messages go to the file `messages`. Ray handles SIGTERM itself once it starts
    (printing its C++ stack and exiting 1); align's handler is put back, so SIGTERM stops a run as Ctrl-C
    does. The workers' environment is handed to each worker as it starts (align/run/workers.py)."""
    import ray

    if messages is not None and not verbose:
        to_file(messages)
    settings = {"log_to_driver": verbose, "logging_config": ray.LoggingConfig(log_level="ERROR")}
    named = address or os.environ.get("RAY_ADDRESS")
    local_head = None if named else running_head()
    note = ""
    if named and ":" in named and "://" not in named and not answers(named):
        raise AlignError(f"cannot join the Ray cluster at {named}: nothing answers there")
    with align_handles_sigterm(hold=False):  # joining starts nothing here: a signal may stop it at once
        if named or local_head:
            try:
                with stderr_to(None if verbose else messages):  # its C++ client's retries, line by line
                    ray.init(address=named or local_head, **settings)
                nodes = len([node for node in ray.nodes() if node["Alive"]])
                cpus = ray.cluster_resources().get("CPU", 0)
                how = "named" if named else "already running on this machine"
                where = f"{named or local_head} ({how})"
                return False, f"ray: joined the cluster at {where}: {nodes} node(s), {cpus:g} CPUs"
            except Exception as err:  # noqa: BLE001 - unreachable, refusing (auth), or another version
                tried = named or local_head
                auth = "it answers: token authentication? (docs/scaling.md, RAY_AUTH_MODE)"
                hint = auth if answers(tried) else ""
                why = "; ".join(filter(None, [first_line(err), hint]))
                if named:
                    raise AlignError(f"cannot join the Ray cluster at {named}: {why}") from None
                note = f" (a Ray head at {local_head} on this machine refused this driver: {why})"
        elif stale := stale_head():
            note = (
                f" (the pointer to a Ray head at {stale} left in Ray's temp folder is stale: no head answers)"
            )
    with align_handles_sigterm(hold=True):
        ray.init(
            address="local",
            num_cpus=os.cpu_count(),
            include_dashboard=False,
            **embedded_head_settings("127.0.0.1", EMBEDDED_SYSTEM_CONFIG),
            **settings,
        )
    return True, f"ray: embedded on this machine, {os.cpu_count()} CPUs{note}"


@contextmanager
def stderr_to(file: Path | None) -> Iterator[None]:
    """Send what the process writes to its stderr (file descriptor 2, where Ray's C++ client logs each
    failed try to join a cluster) to `file` meanwhile; nothing changes for None."""
    if file is None:
        yield
        return
    file.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    kept = os.dup(2)
    try:
        with open(file, "a") as out:
            os.dup2(out.fileno(), 2)
            yield
    finally:
        sys.stderr.flush()
        os.dup2(kept, 2)
        os.close(kept)


def first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


def head_pointer() -> str | None:
    """The address `ray start --head` left in Ray's temp folder, if any."""
    folder = Path(os.environ.get("RAY_TMPDIR") or "/tmp") / "ray"
    try:
        return (folder / "ray_current_cluster").read_text().strip() or None
    except OSError:
        return None


def answers(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=1.0):
            return True
    except (OSError, ValueError):
        return False


def running_head() -> str | None:
    pointer = head_pointer()
    return pointer if pointer and answers(pointer) else None


def stale_head() -> str | None:
    pointer = head_pointer()
    return pointer if pointer and not answers(pointer) else None


@contextmanager
def align_handles_sigterm(hold: bool) -> Iterator[None]:
    """Keep the driver's SIGINT and SIGTERM handlers through `ray.init`: Ray's Python one (set at the start
    of `ray.init`: `sys.exit(15)`, no word) is not installed, and the core worker's C++ one (set as it
    connects: its stack printed, exit 1) is replaced once `ray.init` returns.

    With `hold` (an embedded Ray starting), a signal that lands meanwhile is raised only then, once Ray
    can be shut down whole: interrupted halfway, `ray.init` leaves its dashboard and runtime-env agents
    running with no parent. Joining a cluster starts no process here, and may wait long: not held."""
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    if not callable(handlers[signal.SIGTERM]) or threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    try:
        with no_sigterm_handler():
            for sig in handlers if hold else ():
                signal.signal(sig, lambda signum, _frame: held.append(signum))
            yield
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        if held:
            Interrupted.received = held[0]
            raise Interrupted(held[0])


def to_file(messages: Path) -> None:
    """Send the lines Ray prints on the driver for its cluster events to a file instead of the console.

    Ray has no setting for these (`log_to_driver` covers only the workers' output), so its printer
    is replaced; the lines are kept, not lost."""

    def write(data: dict[str, Any], ignore_prefix: bool) -> None:
        messages.parent.mkdir(parents=True, exist_ok=True)
        with open(messages, "a") as out:
            out.writelines(f"({data.get('pid', 'ray')}) {line}\n" for line in data.get("lines", []))

    print_driver_lines_with(write)


def connected() -> bool:
    """Whether this driver holds a Ray connection (without importing Ray for a run that never started one)."""
    if "ray" not in sys.modules:
        return False
    import ray

    return ray.is_initialized()


def disconnect() -> None:
    """Shut down this driver's Ray connection: an embedded Ray stops with it, and so does every actor
    this driver owns (the run's workers) on a cluster. A run that started no Ray does not import it."""
    if "ray" not in sys.modules:
        return
    import ray

    if ray.is_initialized():
        ray.shutdown()


def lost_workers(stage: str, lost: dict[int, BaseException]) -> LostWorkers:
    """Which ranks Ray lost, and how it noticed."""
    ranks = ", ".join(f"rank {rank} ({type(how).__name__})" for rank, how in sorted(lost.items()))
    return LostWorkers(f"stage '{stage}' lost a worker: {ranks}")


def stage_error(stage: str, rank: int, failure: BaseException) -> StageFailed:
    """The stage's own error in one line: what the first failing rank raised, naming that rank."""
    lines = str(failure).strip().splitlines()
    return StageFailed(
        f"stage '{stage}' failed: {type(failure).__name__}: {lines[-1] if lines else ''}", rank
    )


def ray_launch(
    group: WorkerGroup,
    stage: Launch,
    scratch: Path,
    resume: Path | None,
    *,
    verbose: bool = False,
    on_progress: Callable[[Progress], None] = lambda _: None,
    services: dict[str, Any] | None = None,
) -> StageResult:
    """Run one attempt of the stage on the warm `group` (its plan's `workers` ranks), from `resume` (a
    checkpoint folder) if given; return rank 0's result. The stage's thread waits here, showing progress;
    once the run is asked to stop (Ctrl-C/SIGTERM) it stops the group's workers. A failure leaves the group
    stopped (a rank may be dead, or waiting in a collective for one that is). `services`: the clients of the
    stage's frozen models in actors of their own (align/run/services.py), sent to every rank."""
    clear(scratch)
    config = WorkerConfig(
        launch=stage,
        output_dir=str(scratch),
        resume=str(resume) if resume else None,
        services=services or {},
        verbose=verbose,
    )
    try:
        failures = wait_for(group, group.run(config), scratch, on_progress)
    except BaseException:
        group.stop()  # Ctrl-C or SIGTERM: the caller keeps the stage aside
        raise
    if not failures:
        if (result := take_result(scratch)) is None:
            raise StageFailed(f"stage '{stage.name}' ended on every rank, but rank 0 left no result")
        return result
    group.stop()
    if (error := read_error(scratch)) is not None:
        raise AlignError(error.message) from None
    from ray.exceptions import RayTaskError

    own = {rank: err for rank, err in failures.items() if isinstance(err, RayTaskError)}
    if len(own) < len(failures):
        raise lost_workers(stage.name, {r: e for r, e in failures.items() if r not in own}) from None
    rank = next(iter(own))
    raise stage_error(stage.name, rank, own[rank].cause or own[rank]) from None


def wait_for(
    group: WorkerGroup, runs: list[Any], scratch: Path, on_progress: Callable[[Progress], None]
) -> dict[int, BaseException]:
    """Wait for every rank of the group (its start first), showing progress; the ranks that failed, the
    first to fail first: once one has, the others get a moment to report theirs (a rank that lost its
    peer fails in a collective, or hangs in one)."""
    import ray

    rank_of = {ref: rank for rank, ref in enumerate(group.joined)}
    rank_of.update({ref: rank for rank, ref in enumerate(runs)})
    pending, failures = [*group.joined, *runs], {}
    deadline = None
    while pending and (deadline is None or time.monotonic() < deadline):
        stop.check()
        done, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_SECONDS)
        for ref in done:
            try:
                ray.get(ref)
            except ray.exceptions.RayError as err:
                failures.setdefault(rank_of[ref], err)
                deadline = deadline or time.monotonic() + FAILURE_GRACE_S
        if (progress := read_progress(scratch / LOGS)) is not None:
            on_progress(progress)
    return failures
